/*
 * tuner_base.h - what every part of the tuner and the command line share:
 * error reports in the command line's format, a monotonic clock, progress
 * lines, the directory of the templates and the default device.
 *
 * The tuner reports to the person running it on stderr: it is a program's
 * library, never linked into libattnres.
 */
#ifndef TUNER_BASE_H
#define TUNER_BASE_H

#include <stdarg.h>

/* Exit codes of the command line, which the tuner's entry points that a
 * command hands over to whole (tune_revalidate) return too: 0 success,
 * 1 failure (bad data, device or database), 2 usage error (unknown flag,
 * missing or malformed argument). */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

/* Prints "attnres <cmd>: message" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The device a command uses when --device is not given: the first CUDA
 * device when there is one, else the CPU. */
const char *cli_best_device(void);

/* Directory of the templates: $ATTNRES_TEMPLATE_DIR, else the source tree's
 * or the installed copy. */
const char *cli_template_dir(void);

/* Seconds on the monotonic clock. */
double artuner_now_s(void);

/* Writes one progress line to stderr, unless quiet: the format's text and a
 * newline. */
void artuner_vlog(int quiet, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#endif
