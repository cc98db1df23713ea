/* tuner_base.c - see tuner_base.h. */
#include "tuner_base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "tune_session.h"

void artuner_verror(const char *cmd, const char *fmt, va_list ap)
{
    fprintf(stderr, "attnres %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void artuner_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    artuner_verror(cmd, fmt, ap);
    va_end(ap);
}

double artuner_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void artuner_vlog(int quiet, const char *fmt, va_list ap)
{
    if (quiet)
        return;
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

/* Declared in tune_session.h: a line of a tuning run's log, unless quiet. */
void artuner_log(const tuner *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    artuner_vlog(t->opt.quiet, fmt, ap);
    va_end(ap);
}

#ifndef ATTNRES_SOURCE_TEMPLATE_DIR
#define ATTNRES_SOURCE_TEMPLATE_DIR "templates"
#endif
#ifndef ATTNRES_INSTALLED_TEMPLATE_DIR
#define ATTNRES_INSTALLED_TEMPLATE_DIR "/usr/local/share/attnres/templates"
#endif

const char *artuner_template_dir(void)
{
    const char *env = getenv("ATTNRES_TEMPLATE_DIR");
    if (env && *env)
        return env;
    if (access(ATTNRES_SOURCE_TEMPLATE_DIR "/cpu/mix.lua", R_OK) == 0)
        return ATTNRES_SOURCE_TEMPLATE_DIR;
    return ATTNRES_INSTALLED_TEMPLATE_DIR;
}
