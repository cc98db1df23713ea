/*
 * cli.h - what the `attnres` subcommands share: exit codes, error reports,
 * the default device, strict number parsing and the list of commands.
 */
#ifndef TUNER_CLI_H
#define TUNER_CLI_H

#include <stdint.h>

/* Exit codes: 0 success, 1 failure (bad data, device or database), 2 usage
 * error (unknown flag, missing or malformed argument). */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

/* Prints "attnres <cmd>: message" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The device a command uses when --device is not given: the first CUDA
 * device when there is one, else the CPU. */
const char *cli_best_device(void);

/* A whole-string number; 0 on success, -1 (with a message printed) if not. */
int cli_parse_double(const char *cmd, const char *flag, const char *text, double *out);

/* Parses a whole-string decimal integer in [min, max]; 0 on success, -1 with
 * "FLAG must be an integer from MIN to MAX (got 'TEXT')" printed if not, so
 * that a value beyond the range is refused, never truncated or wrapped. A
 * sign other than '-' and surrounding spaces are refused too. */
int cli_parse_int_range(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max,
                        int64_t *out);

/* A finite number greater than zero (seconds, budgets): 0 or -1 as above. */
int cli_parse_positive(const char *cmd, const char *flag, const char *text, double *out);

/* ---- options ---------------------------------------------------------------
 * Every command reads its arguments with cli_parse, from a table of the
 * flags it takes: one place decides what a flag, a value and a positional
 * argument are, and every refusal names the flag and the bad value. */

typedef enum cli_opt_type {
    CLI_FLAG,     /* no value: *(int *)dst = 1 */
    CLI_STRING,   /* *(const char **)dst = the value */
    CLI_INT,      /* *(int *)dst, an integer in [min, max] */
    CLI_INT64,    /* *(int64_t *)dst, an integer in [min, max] */
    CLI_DOUBLE,   /* *(double *)dst, a number */
    CLI_POSITIVE, /* *(double *)dst, a finite number > 0 */
    CLI_CHOICE,   /* *(int *)dst = the index of the value in choices */
    CLI_CUSTOM    /* parse(cmd, flag, value, dst) decides */
} cli_opt_type;

typedef struct cli_opt {
    const char *name; /* "--db" */
    cli_opt_type type;
    void *dst;
    int64_t min, max;           /* CLI_INT, CLI_INT64 */
    const char *const *choices; /* CLI_CHOICE: NULL-terminated */
    /* CLI_CUSTOM: 0, or -1 after printing a message that names flag. */
    int (*parse)(const char *cmd, const char *flag, const char *value, void *dst);
    int *seen; /* when not NULL, set to 1 when the flag is given */
    /* CLI_STRING: when not NULL, the flag must be given (its value is then
     * not NULL); without it cli_parse refuses with this message. */
    const char *required;
} cli_opt;

/* Table entries: CLI_OPT_STRING("--db", &path), CLI_OPT_INT("--jobs",
 * &jobs, 1, 256), ...; designators may follow (.seen = &given). A table
 * ends with CLI_OPT_END. */
#define CLI_OPT_FLAG(n, d, ...) {.name = (n), .type = CLI_FLAG, .dst = (d), __VA_ARGS__}
#define CLI_OPT_STRING(n, d, ...) {.name = (n), .type = CLI_STRING, .dst = (d), __VA_ARGS__}
#define CLI_OPT_INT(n, d, lo, hi, ...) {.name = (n), .type = CLI_INT, .dst = (d), .min = (lo), .max = (hi), __VA_ARGS__}
#define CLI_OPT_INT64(n, d, lo, hi, ...) \
    {.name = (n), .type = CLI_INT64, .dst = (d), .min = (lo), .max = (hi), __VA_ARGS__}
#define CLI_OPT_DOUBLE(n, d, ...) {.name = (n), .type = CLI_DOUBLE, .dst = (d), __VA_ARGS__}
#define CLI_OPT_POSITIVE(n, d, ...) {.name = (n), .type = CLI_POSITIVE, .dst = (d), __VA_ARGS__}
#define CLI_OPT_CHOICE(n, d, list, ...) {.name = (n), .type = CLI_CHOICE, .dst = (d), .choices = (list), __VA_ARGS__}
#define CLI_OPT_CUSTOM(n, d, fn, ...) {.name = (n), .type = CLI_CUSTOM, .dst = (d), .parse = (fn), __VA_ARGS__}
#define CLI_OPT_END {.name = NULL}

typedef struct cli_spec {
    const char *cmd;   /* "tune", "db": messages read "attnres CMD: ..." */
    const char *usage; /* printed to stdout on --help or -h; NULL: the
                        * caller has handled help (db's subcommands) */
    const cli_opt *opts; /* ended by an entry whose name is NULL */
    /* Positional arguments: up to max_pos go to pos[], their count to
     * *npos. One more is refused with "EXTRA ('ARG' is extra)". */
    const char **pos;
    int max_pos;
    int *npos;
    const char *extra;
    /* Fewer than min_pos positional arguments are refused with `missing`. */
    int min_pos;
    const char *missing;
    /* Whether "-x" (one dash) is a positional argument rather than an
     * option, for commands whose arguments are free text or run ids. */
    int dash_positional;
} cli_spec;

/* A CLI_CUSTOM parser for --dtype: f32, bf16 or f16 into an attnres_dtype. */
int cli_parse_dtype(const char *cmd, const char *flag, const char *value, void *dst);

/* A CLI_CUSTOM parser for --op: an op by its problems-file name (mix,
 * phase1, phase2, mix_backward, phase1_backward, phase2_backward) into an
 * attnres_op. */
int cli_parse_op(const char *cmd, const char *flag, const char *value, void *dst);

#define CLI_PARSED 0
#define CLI_HELP 1 /* the usage was printed: exit with CLI_EXIT_OK */

/* Parses argv[1..argc) (argv[0] is the command's name). Later flags
 * override earlier ones; "--" ends the options, and "-" alone is a
 * positional argument. Returns CLI_PARSED, CLI_HELP, or -1 after printing
 * what is wrong (exit with CLI_EXIT_USAGE): an unknown option, a flag
 * without its value, a value out of range, an unexpected argument, a
 * missing positional argument or required flag. */
int cli_parse(const cli_spec *spec, int argc, char **argv);

/* The default of tune's --retries (cmd_tune.c): ATTNRES_TUNE_RETRIES where
 * set, 0 to 10, for scripts and test suites that tune on busy machines on
 * purpose; else 2. `db revalidate` takes the same, since it decides
 * provisional winners again as `tune --revalidate` does. 0, or -1 when the
 * variable is out of range (said). */
int tune_retries_default(int *retries);

int cmd_devices(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_db(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_plan(int argc, char **argv);

#endif
