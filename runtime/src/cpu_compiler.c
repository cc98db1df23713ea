/* cpu_compiler.c - see cpu_compiler.h. */
#define _GNU_SOURCE
#include "cpu_compiler.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "binary_cache.h"
#include "sha256.h"

extern char **environ;

int ar_cc_run(char *const argv[], const char *log_path, int *spawn_error)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        *spawn_error = rc;
        return -1;
    }
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    return ws;
}

/* What the generated kernels include first (templates/lib/c_kernel.lua and
 * c_storage.lua). A kernel that includes less is compiled with more
 * declarations in view, which changes none of its code. */
static const char pch_text[] = "/* attnres: the system headers of generated CPU kernels, precompiled. */\n"
                               "#include <math.h>\n"
                               "#include <stdint.h>\n"
                               "#include <string.h>\n"
#if defined(__x86_64__)
                               "#include <immintrin.h>\n"
#endif
    ;

/* One maker at a time in a process; a compiler that made no precompiled
 * header is not asked again by this process. */
static pthread_mutex_t pch_lock = PTHREAD_MUTEX_INITIALIZER;
static char pch_failed_for[512];

/* The cache name of the header: its text, the compiler and the options. */
static int pch_path(const char *cc, const char *identity, char *path, size_t len)
{
    static const char *const options[] = {AR_CPU_CC_OPTIONS};
    ar_sha256 h;
    ar_sha256_init(&h);
    ar_sha256_update(&h, cc, strlen(cc) + 1);
    ar_sha256_update(&h, identity, strlen(identity) + 1);
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        ar_sha256_update(&h, options[i], strlen(options[i]) + 1);
    ar_sha256_update(&h, pch_text, sizeof pch_text);
    char hex[65];
    ar_sha256_hex(&h, hex);
    char key[64];
    snprintf(key, sizeof key, "pch-%.24s", hex);
    return ar_cache_path(key, ".h", path, len);
}

/* Compiles the header in work_dir and stores it and its precompiled form
 * beside each other in the cache, the text first: a header without its
 * precompiled form is still a correct one. */
static int pch_make(const char *cc, const char *work_dir, const char *path)
{
    char hdr[4200], gch[4200], log[4200], dest[4300];
    snprintf(hdr, sizeof hdr, "%s/pch.h", work_dir);
    snprintf(gch, sizeof gch, "%s/pch.h.gch", work_dir);
    snprintf(log, sizeof log, "%s/pch-log.txt", work_dir);
    FILE *f = fopen(hdr, "wb");
    if (!f)
        return -1;
    int bad = fwrite(pch_text, 1, sizeof pch_text - 1, f) != sizeof pch_text - 1;
    if (fclose(f) != 0 || bad)
        return -1;
    char *argv[] = {(char *)cc, AR_CPU_CC_OPTIONS, "-x", "c-header", "-o", gch, hdr, NULL};
    int spawn_error = 0;
    int ws = ar_cc_run(argv, log, &spawn_error);
    unlink(hdr);
    unlink(log);
    void *blob = NULL;
    size_t size = 0;
    int ok = ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && ar_read_file(gch, &blob, &size) == 0 && size > 0;
    unlink(gch);
    snprintf(dest, sizeof dest, "%s.gch", path);
    ok = ok && ar_cache_store(path, pch_text, sizeof pch_text - 1) == 0 && ar_cache_store(dest, blob, size) == 0;
    free(blob);
    return ok ? 0 : -1;
}

int ar_cpu_pch(const char *cc, const char *identity, const char *work_dir, char *path, size_t len)
{
    if (pch_path(cc, identity, path, len) != 0)
        return -1;
    char gch[4300];
    snprintf(gch, sizeof gch, "%s.gch", path);
    struct stat st;
    if (stat(path, &st) == 0 && stat(gch, &st) == 0)
        return 0;
    pthread_mutex_lock(&pch_lock);
    int rc = 0;
    if (strcmp(pch_failed_for, path) == 0)
        rc = -1;
    else if (stat(path, &st) != 0 || stat(gch, &st) != 0) {
        rc = pch_make(cc, work_dir, path);
        if (rc != 0)
            snprintf(pch_failed_for, sizeof pch_failed_for, "%s", path);
    }
    pthread_mutex_unlock(&pch_lock);
    return rc;
}

void ar_cpu_pch_drop(const char *path)
{
    char gch[4300];
    snprintf(gch, sizeof gch, "%s.gch", path);
    ar_cache_drop(gch);
}
