/*
 * replay.c - runs a fuzz target over every file of corpus directories, as
 * ctest does on every build: the regression test of the fuzz targets, with
 * no libFuzzer needed (any C compiler).
 *
 * Usage: fuzz_replay_TARGET [--list] [--case FILE]... DIR...
 *
 * --case FILE replays only the corpus file of that name (may repeat);
 * --list prints the names of the files instead of replaying them. A file
 * that fails is followed by the command that replays it alone (the
 * harness of tests/lib/check.h).
 *
 * A corpus file's name says what the loader must answer:
 *   ok-...    must be accepted;
 *   bad-...   must be refused (with a message);
 *   anything else: either, as long as nothing breaks (a sanitizer report,
 *             a crash or a broken invariant of the target is a failure).
 * A name may start with "known-REF--" (e.g. "known-i13.10--bad-shape.npy"):
 * the input shows a defect that is known and tracked as REF (the issue
 * and item that track it) but not fixed on this branch. Such a file runs in a child
 * process; when it still fails, the replayer prints the child's report and
 * "KNOWN DEFECT ... still present" and goes on, so that the suite passes
 * until the fix lands; once it passes, the replayer says to drop the
 * prefix. Only files marked that way are tolerated: sanitizer reports stay
 * fatal everywhere else. ATTNRES_FUZZ_STRICT=1 treats known files as
 * ordinary ones (to check a fix).
 *
 * Exit status: 0 when every ordinary file met its expectation, 1 otherwise.
 */
#include "../lib/check.h"
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum expect { EXPECT_ANY, EXPECT_OK, EXPECT_BAD };

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static uint8_t *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fclose(f);
        return NULL;
    }
    /* Exactly the file's bytes (one more only for an empty file), so that
     * ASan sees any read past the input's end, as under libFuzzer. */
    *size = (size_t)st.st_size;
    uint8_t *buf = malloc(*size ? *size : 1);
    if (buf && *size && fread(buf, 1, *size, f) != *size) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* Runs one input; 0 when the verdict meets the expectation. */
static int run_one(const char *path, const char *name, enum expect e)
{
    size_t size = 0;
    uint8_t *data = read_all(path, &size);
    if (!data) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        return 1;
    }
    fuzz_verdict = -1;
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    if (fuzz_verdict != FUZZ_ACCEPTED && fuzz_verdict != FUZZ_REFUSED) {
        fprintf(stderr, "replay: %s: the target set no verdict\n", name);
        return 1;
    }
    if (e == EXPECT_OK && fuzz_verdict != FUZZ_ACCEPTED) {
        fprintf(stderr, "replay: %s: refused, but must be accepted\n", name);
        return 1;
    }
    if (e == EXPECT_BAD && fuzz_verdict != FUZZ_REFUSED) {
        fprintf(stderr, "replay: %s: accepted, but must be refused\n", name);
        return 1;
    }
    return 0;
}

/* Where a sanitizer writes its report when its options name a log_path
 * (.ci/run does, to catch reports of processes whose exit nobody checks):
 * the report of a tolerated known defect is shown here and removed, so
 * that it is not mistaken for an unexpected one. */
static void claim_child_report(const char *env, pid_t pid)
{
    const char *opts = getenv(env), *p = opts ? strstr(opts, "log_path=") : NULL;
    if (!p)
        return;
    p += 9;
    char path[4096];
    snprintf(path, sizeof path, "%.*s.%d", (int)strcspn(p, ":"), p, (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[1024];
    printf("---- %s report of the known defect (from %s) ----\n", env, path);
    while (fgets(line, sizeof line, f))
        fputs(line, stdout);
    fclose(f);
    unlink(path);
}

/* A known defect runs in a child, so that its sanitizer report or crash
 * ends the child only. */
static int run_in_child(const char *path, const char *name, enum expect e)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0)
        exit(run_one(path, name, e) ? 3 : 0);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return 1;
    claim_child_report("ASAN_OPTIONS", pid);
    claim_child_report("UBSAN_OPTIONS", pid);
    return !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s [--list] [--case FILE]... CORPUS_DIR...\n", argv[0]);
        return 2;
    }
    const char *strict_env = getenv("ATTNRES_FUZZ_STRICT");
    const int strict = strict_env && !strcmp(strict_env, "1");
    int files = 0, failed = 0, known_open = 0, known_fixed = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        if (!d) {
            fprintf(stderr, "replay: cannot open the corpus directory %s\n", argv[a]);
            return 1;
        }
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *ent;
        while ((ent = readdir(d))) {
            if (ent->d_name[0] == '.' || !strcmp(ent->d_name, "README.md"))
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                names = realloc(names, cap * sizeof *names);
                if (!names)
                    return 1;
            }
            names[n++] = strdup(ent->d_name);
        }
        closedir(d);
        /* Sorted, so that runs are reproducible and reports comparable. */
        qsort(names, n, sizeof *names, cmp_names);
        for (size_t i = 0; i < n; i++) {
            const int selected = check_name_selected(names[i]);
            if (selected && check_listing)
                printf("%s\n", names[i]);
            if (!selected || check_listing) {
                free(names[i]);
                continue;
            }
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], names[i]);
            const char *rest = names[i];
            char ref[64] = "";
            int known = 0;
            if (!strncmp(rest, "known-", 6) && strstr(rest, "--")) {
                const char *end = strstr(rest, "--");
                snprintf(ref, sizeof ref, "%.*s", (int)(end - rest - 6), rest + 6);
                rest = end + 2;
                known = !strict;
            }
            enum expect e = !strncmp(rest, "ok-", 3)    ? EXPECT_OK
                            : !strncmp(rest, "bad-", 4) ? EXPECT_BAD
                                                        : EXPECT_ANY;
            files++;
            if (known) {
                if (run_in_child(path, names[i], e)) {
                    known_open++;
                    printf("KNOWN DEFECT %s still present: %s (tolerated: see the report above)\n", ref,
                           names[i]);
                } else {
                    known_fixed++;
                    printf("known defect %s does not show in this build: once it passes in the sanitizer build too, drop the \"known-%s--\" prefix of %s\n",
                           ref, ref, names[i]);
                }
            } else if (run_one(path, names[i], e)) {
                failed++;
                printf("FAILED: %s\n", names[i]);
                check_print_rerun(names[i]);
            }
            free(names[i]);
        }
        free(names);
    }
    if (!check_listing)
        printf("replay: %d files, %d failed, %d known defects still present, %d known defects fixed\n", files,
               failed, known_open, known_fixed);
    return check_exit_status(failed);
}
