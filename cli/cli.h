/*
 * cli.h - what the `attnres` subcommands share: strict number parsing and
 * the list of commands (error reports are tuner_base.h's).
 *
 * Exit codes: 0 success, 1 failure (bad data, device or database), 2 usage
 * error (unknown flag, missing or malformed argument).
 */
#ifndef TUNER_CLI_H
#define TUNER_CLI_H

#include <stdint.h>

#include "tuner_base.h" /* exit codes, cli_error, cli_best_device, cli_template_dir */

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

int cmd_devices(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_db(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_plan(int argc, char **argv);

#endif
