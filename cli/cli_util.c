/* cli_util.c - the command line's error reports and default device (cli.h). */
#include "cli.h"

#include <stdarg.h>

#include "attnres.h"
#include "tuner_base.h"

/* A command hands the tuner's status over as its own (tune_revalidate). */
_Static_assert(ARTUNER_EXIT_OK == CLI_EXIT_OK && ARTUNER_EXIT_FAIL == CLI_EXIT_FAIL,
               "the tuner's exit statuses are the command line's");

/* One format for every message of a command, the tuner's included. */
void cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    artuner_verror(cmd, fmt, ap);
    va_end(ap);
}

const char *cli_best_device(void)
{
    return attnres_device_count("cuda") > 0 ? "cuda:0" : "cpu";
}
