/*
 * tuner_base.h - what every part of the tuner shares: error reports in the
 * command line's format, a monotonic clock, progress lines and the
 * directory of the templates. The command line's own helpers (its exit
 * codes, its error reports, its default device) are its own.
 *
 * The tuner reports to the person running it on stderr: it is a program's
 * library, never linked into libattnres.
 */
#ifndef TUNER_BASE_H
#define TUNER_BASE_H

#include <stdarg.h>

/* What the tuner's entry points that a command hands over to whole
 * (tune_revalidate) return: the command line's exit codes for success and
 * for failure (bad data, device or database), which the command line
 * checks they equal. */
#define ARTUNER_EXIT_OK 0
#define ARTUNER_EXIT_FAIL 1

/* Prints "attnres <cmd>: message" to stderr: the tuner runs inside a
 * command, and reports as the command line does. */
void artuner_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void artuner_verror(const char *cmd, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* Directory of the templates: $ATTNRES_TEMPLATE_DIR, else the source tree's
 * or the installed copy. */
const char *artuner_template_dir(void);

/* Seconds on the monotonic clock. */
double artuner_now_s(void);

/* Writes one progress line to stderr, unless quiet: the format's text and a
 * newline. */
void artuner_vlog(int quiet, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#endif
