/*
 * main.c - the `attnres` command line: one binary, one subcommand a job.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "attnres.h"
#include "cli.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"devices", cmd_devices, "list the devices present and their fingerprints"},
    {"gen", cmd_gen, "list kernel variants or print one variant's source"},
    {"tune", cmd_tune, "tune problems on a device and record the results"},
    {"db", cmd_db, "inspect a tuning database"},
    {"plan", cmd_plan, "show which kernels the runtime would use, and why"},
    {"run", cmd_run, "run mix, phase1 or phase2 on .npy inputs"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: attnres <command> [options]   (attnres <command> --help for each)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nattnres %s\n", attnres_version());
}

int main(int argc, char **argv)
{
    /* Past a file-size limit (ulimit -f) a write then fails with EFBIG,
     * which every writer reports and recovers from, instead of the signal
     * killing the command with its temporaries left behind. */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("attnres %s\n", attnres_version());
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "attnres: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
