/*
 * cli.h - what the `attnres` subcommands share: strict number parsing,
 * error reporting, and the list of commands.
 *
 * Exit codes: 0 success, 1 failure (bad data, device or database), 2 usage
 * error (unknown flag, missing or malformed argument).
 */
#ifndef TUNER_CLI_H
#define TUNER_CLI_H

#include <stdint.h>

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

/* Prints "attnres <cmd>: message" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whole-string parses; 0 on success, -1 (with a message printed) if not. */
int cli_parse_double(const char *cmd, const char *flag, const char *text, double *out);
int cli_parse_int(const char *cmd, const char *flag, const char *text, int64_t *out);

/* Parses a whole-string decimal integer in [min, max]; 0 on success, -1 with
 * "FLAG must be an integer from MIN to MAX (got 'TEXT')" printed if not, so
 * that a value beyond the range is refused, never truncated or wrapped. A
 * sign other than '-' and surrounding spaces are refused too. */
int cli_parse_int_range(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max,
                        int64_t *out);

/* A finite number greater than zero (seconds, budgets): 0 or -1 as above. */
int cli_parse_positive(const char *cmd, const char *flag, const char *text, double *out);

/* Returns argv[*i + 1] and advances, or prints "FLAG needs a value". */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

/* The device a command uses when --device is not given: the first CUDA
 * device when there is one, else the CPU. */
const char *cli_best_device(void);

int cmd_devices(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_db(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_plan(int argc, char **argv);

/* Directory of the templates: $ATTNRES_TEMPLATE_DIR, else the source tree's
 * or the installed copy. */
const char *cli_template_dir(void);

#endif
