/*
 * check.h - the minimal assertion helpers of the C unit tests.
 *
 * A test program runs its cases, prints one "ok"/"FAIL" line per check that
 * fails or per case, and exits non-zero when any check failed, so that ctest
 * counts it. CHECK continues after a failure; REQUIRE returns from the case.
 *
 * One case at a time, as libuv's and ggml's harnesses allow: CHECK_ARGS at
 * the top of main takes the harness's options out of argv and leaves the
 * program's own (positional) arguments in argc/argv:
 *
 *   --case NAME   runs only the case NAME (may repeat); a NAME that no case
 *                 of the program has is an error (exit 2);
 *   --list        prints the names of the cases instead of running them.
 *
 * A case that fails prints the command that reruns it alone:
 *   rerun: [env ATTNRES_...=...] /abs/path/program --case NAME ARGS...
 * It carries the ATTNRES_ variables the program started with, since ctest
 * sets some of them (the simulated CUDA driver, the template directory).
 *
 * Names are paths: a case that loops over units (the trials of a property
 * test) names each unit "CASE/UNIT" with check_unit. A NAME selects the
 * case or unit of that name and everything under it: "CASE" runs every
 * unit of CASE.
 */
#ifndef CHECK_H
#define CHECK_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Unused in programs that count failures themselves (RUN_CASE_COUNTING). */
static int check_failures __attribute__((unused));

/* Counts a failed check or requirement and says where and what it was;
 * `text` is the condition as written (stringized by the caller, before
 * its macros expand). */
#define CHECK_FAILED_(kind, text) \
    (fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, (kind), (text)), check_failures++)

#define CHECK(cond)                               \
    do {                                          \
        if (!(cond))                              \
            CHECK_FAILED_("check failed", #cond); \
    } while (0)

#define REQUIRE(cond)                         \
    do {                                      \
        if (!(cond)) {                        \
            CHECK_FAILED_("required", #cond); \
            return;                           \
        }                                     \
    } while (0)

/* Checks that the message `msg` of the refusal `what` holds `needle`,
 * printing all three where it does not. */
static inline void check_message_has(const char *what, const char *msg, const char *needle)
{
    if (!strstr(msg, needle)) {
        fprintf(stderr, "%s: message '%s' lacks '%s'\n", what, msg, needle);
        check_failures++;
    }
}

/* ---- selection ------------------------------------------------------- */

#define CHECK_MAX_SELECTED 64
#define CHECK_MAX_ENV 32

static int check_listing;                   /* --list: print, run nothing */
static const char *check_selected[CHECK_MAX_SELECTED];
static int check_selected_hit[CHECK_MAX_SELECTED];
static int check_nselected;
static int check_rerun_argc;                /* the program's own arguments */
static char **check_rerun_argv;
static const char *check_rerun_env[CHECK_MAX_ENV];
static int check_rerun_nenv;
static char check_program[PATH_MAX];
static char check_running[512];             /* the case now running */

/* Takes --case NAME, --case=NAME and --list out of argv, keeping the other
 * arguments in order. Returns -1 to go on, or the exit status of a usage
 * error. */
static inline int check_args(int *argc, char **argv)
{
    extern char **environ;
    int kept = 1;
    for (int i = 1; i < *argc; i++) {
        const char *name = NULL;
        if (strcmp(argv[i], "--list") == 0) {
            check_listing = 1;
            continue;
        }
        if (strcmp(argv[i], "--case") == 0) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "%s: --case needs a case name (--list prints them)\n", argv[0]);
                return 2;
            }
            name = argv[++i];
        } else if (strncmp(argv[i], "--case=", 7) == 0) {
            name = argv[i] + 7;
        } else {
            argv[kept++] = argv[i];
            continue;
        }
        if (check_nselected == CHECK_MAX_SELECTED) {
            fprintf(stderr, "%s: more than %d --case options\n", argv[0], CHECK_MAX_SELECTED);
            return 2;
        }
        check_selected[check_nselected++] = name;
    }
    argv[kept] = NULL;
    *argc = kept;
    check_rerun_argc = kept - 1;
    check_rerun_argv = argv + 1;
    /* The path of the running binary, so that the rerun line works from any
     * directory; argv[0] made absolute where /proc is missing. */
    ssize_t n = readlink("/proc/self/exe", check_program, sizeof check_program - 1);
    if (n > 0)
        check_program[n] = '\0';
    else if (!realpath(argv[0], check_program))
        snprintf(check_program, sizeof check_program, "%s", argv[0]);
    /* Kept as the program found them: a case may set some itself later. */
    for (char **e = environ; e && *e && check_rerun_nenv < CHECK_MAX_ENV; e++)
        if (strncmp(*e, "ATTNRES_", 8) == 0)
            check_rerun_env[check_rerun_nenv++] = *e;
    return -1;
}

/* For a program that takes `count` arguments of its own, named `names` in
 * its usage line, after CHECK_ARGS: whether they are missing, with the
 * usage printed. Under --list no case runs, so none is needed. */
static inline int check_usage(int argc, char **argv, int count, const char *names)
{
    if (argc == count + 1 || check_listing)
        return 0;
    const char *slash = strrchr(argv[0], '/');
    fprintf(stderr, "usage: %s [--list] [--case NAME]... %s\n", slash ? slash + 1 : argv[0], names);
    return 1;
}

#define CHECK_ARGS(argc, argv)                             \
    do {                                                   \
        const int check_rc_ = check_args(&(argc), (argv)); \
        if (check_rc_ >= 0)                                \
            return check_rc_;                              \
    } while (0)

/* Whether selector sel names name or a path above it ("a" names "a/b"). */
static inline int check_name_under(const char *sel, const char *name)
{
    const size_t n = strlen(sel);
    return strncmp(sel, name, n) == 0 && (name[n] == '\0' || name[n] == '/');
}

/* Whether the case or unit `name` runs; marks the selectors it answers. */
static inline int check_name_selected(const char *name)
{
    int yes = check_nselected == 0;
    for (int i = 0; i < check_nselected; i++)
        if (check_name_under(check_selected[i], name)) {
            check_selected_hit[i] = 1;
            yes = 1;
        }
    return yes;
}

/* Whether a selector names a unit inside case `name` ("name/unit"). */
static inline int check_selects_inside(const char *name)
{
    for (int i = 0; i < check_nselected; i++)
        if (check_name_under(name, check_selected[i]) && strcmp(name, check_selected[i]) != 0)
            return 1;
    return 0;
}

/* Prints s as one shell word: as it is, or quoted when it has to be. */
static inline void check_put_word(const char *s)
{
    if (*s && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./:=,+@%") == strlen(s)) {
        fputs(s, stdout);
        return;
    }
    putchar('\'');
    for (; *s; s++)
        if (*s == '\'')
            fputs("'\\''", stdout);
        else
            putchar(*s);
    putchar('\'');
}

/* Prints "LABEL: [env ATTNRES_...=...] /abs/path/program", without a
 * newline: the start of a command that runs this program again as it
 * started, for the caller to add its arguments to. */
static inline void check_print_program(const char *label)
{
    printf("%s: ", label);
    if (check_rerun_nenv)
        fputs("env ", stdout);
    for (int i = 0; i < check_rerun_nenv; i++) {
        check_put_word(check_rerun_env[i]);
        putchar(' ');
    }
    check_put_word(check_program[0] ? check_program : "PROGRAM");
}

/* Prints the command that reruns the case or unit `name` alone. */
static inline void check_print_rerun(const char *name)
{
    check_print_program("rerun");
    fputs(" --case ", stdout);
    check_put_word(name);
    for (int i = 0; i < check_rerun_argc; i++) {
        putchar(' ');
        check_put_word(check_rerun_argv[i]);
    }
    putchar('\n');
    fflush(stdout);
}

/* The unit of the running case that check_unit started, and the failure
 * count when it started, to tell whether it failed. */
static char check_unit_name[512];
static int *check_unit_failures;
static int check_unit_before;

/* Ends the unit check_unit started last: prints the command that reruns it
 * when checks failed since it started. A case calls it after its loop over
 * units when checks on totals follow; the end of a case calls it too. */
static inline void check_units_end(void)
{
    char name[1024];
    if (check_unit_name[0] && check_unit_failures && *check_unit_failures != check_unit_before) {
        snprintf(name, sizeof name, "%s/%s", check_running, check_unit_name);
        check_print_rerun(name);
    }
    check_unit_name[0] = '\0';
}

/* Runs fn as the case `name` when it is selected (always, for a fixture),
 * counting its failures in *failures; under --list prints the name
 * instead. */
static inline void check_run_case(const char *name, void (*fn)(void), int *failures, int fixture)
{
    const int selected = check_name_selected(name) || check_selects_inside(name);
    if (!selected && !(fixture && !check_listing))
        return;
    if (check_listing) {
        printf("%s\n", name);
        return;
    }
    snprintf(check_running, sizeof check_running, "%s", name);
    check_unit_failures = failures;
    const int before = *failures;
    fn();
    check_units_end();
    check_running[0] = '\0';
    printf("%s %s\n", *failures == before ? "ok  " : "FAIL", name);
    if (*failures != before)
        check_print_rerun(name);
}

#define RUN_CASE(fn) check_run_case(#fn, fn, &check_failures, 0)

/* A case whose state the cases after it use (templates it loads): it runs
 * whichever cases --case selects, so that each of them can run alone. */
#define RUN_FIXTURE(fn) check_run_case(#fn, fn, &check_failures, 1)

/* RUN_CASE for a harness with its own failure counter. */
#define RUN_CASE_COUNTING(fn, failures) check_run_case(#fn, fn, &(failures), 0)

/* Inside a running case that loops over units (variant ids): ends the
 * previous unit (see check_units_end), then says whether the unit `unit`,
 * "CASE/unit", runs; if it does, the checks that fail from here until the
 * next unit are its failures. */
static inline int check_unit(const char *unit)
{
    char name[1024];
    check_units_end();
    snprintf(name, sizeof name, "%s/%s", check_running, unit);
    if (!check_name_selected(name))
        return 0;
    snprintf(check_unit_name, sizeof check_unit_name, "%s", unit);
    check_unit_before = check_unit_failures ? *check_unit_failures : 0;
    return 1;
}

/* Inside a running case: whether every unit of it runs, so that checks on
 * totals over the units (how many variants there are) apply. */
static inline int check_every_unit(void)
{
    return !check_selects_inside(check_running);
}

/* Inside a running case: prints the command that reruns its unit `unit`,
 * for a case that counts a unit's failures after its loop over units. */
static inline void check_unit_failed(const char *unit)
{
    char name[1024];
    snprintf(name, sizeof name, "%s/%s", check_running, unit);
    check_print_rerun(name);
}

/* The exit status of a program whose checks failed `failures` times: 2
 * when a --case named nothing the program has, else 1 on any failure. */
static inline int check_exit_status(int failures)
{
    int unknown = 0;
    for (int i = 0; i < check_nselected; i++)
        if (!check_selected_hit[i]) {
            fprintf(stderr, "no case named '%s' (--list prints the cases)\n", check_selected[i]);
            unknown = 1;
        }
    if (unknown)
        return 2;
    return failures ? 1 : 0;
}

#define CHECK_EXIT()                                                         \
    do {                                                                     \
        if (!check_listing)                                                  \
            printf("%d check(s) failed\n", check_failures);                  \
        return check_exit_status(check_failures);                            \
    } while (0)

#endif
