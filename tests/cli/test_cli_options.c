/*
 * test_cli_options.c - the command line's one option parser (cli/cli.c,
 * cli_parse): every kind of value, positional arguments and their limit,
 * "--", later flags overriding earlier ones, and that every refusal names
 * the flag and the bad value. The messages go to stderr, which the test
 * sends to a file and reads back.
 *
 * usage: test_cli_options SCRATCH_DIR
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attnres.h"
#include "check.h"
#include "cli.h"

static char err_path[1024], err_text[4096];

/* Runs cli_parse on the words of args (argv[0] is "cmd") with stderr going
 * to a file, whose text is left in err_text. */
static int parse(const cli_spec *spec, const char *const *args)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = "cmd";
    for (; args[argc - 1] && argc < 32; argc++)
        argv[argc] = (char *)args[argc - 1];
    /* The descriptor is swapped under the stdio stream, so that the
     * test's own reports still reach the real stderr afterwards. */
    fflush(stderr);
    int saved = dup(2), fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (saved < 0 || fd < 0 || dup2(fd, 2) < 0) {
        perror(err_path);
        exit(2);
    }
    close(fd);
    int rc = cli_parse(spec, argc, argv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(err_path, "r");
    size_t n = f ? fread(err_text, 1, sizeof err_text - 1, f) : 0;
    err_text[n] = 0;
    if (f)
        fclose(f);
    return rc;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_ARGS ((const char *const[]){NULL})

/* The options of a made-up command, one of every kind. */
static const char *s_db, *s_pos[2];
static int s_flag, s_jobs, s_choice, s_npos, s_seen;
static int64_t s_count;
static double s_num, s_pos_num;
static const char *const colours[] = {"red", "green", "blue", NULL};

static int parse_even(const char *cmd, const char *flag, const char *value, void *dst)
{
    int64_t v;
    if (cli_parse_int_range(cmd, flag, value, 0, 100, &v))
        return -1;
    if (v % 2) {
        cli_error(cmd, "%s must be even (got '%s')", flag, value);
        return -1;
    }
    *(int64_t *)dst = v;
    return 0;
}
static int64_t s_even;

static const cli_opt s_opts[] = {CLI_OPT_STRING("--db", &s_db),
                                 CLI_OPT_FLAG("--quiet", &s_flag),
                                 CLI_OPT_INT("--jobs", &s_jobs, 1, 256),
                                 CLI_OPT_INT64("--count", &s_count, 0, INT64_MAX, .seen = &s_seen),
                                 CLI_OPT_DOUBLE("--eps", &s_num),
                                 CLI_OPT_POSITIVE("--time", &s_pos_num),
                                 CLI_OPT_CHOICE("--colour", &s_choice, colours),
                                 CLI_OPT_CUSTOM("--even", &s_even, parse_even),
                                 CLI_OPT_END};

static void reset(void)
{
    s_db = NULL;
    s_pos[0] = s_pos[1] = NULL;
    s_flag = s_jobs = s_choice = s_npos = s_seen = 0;
    s_count = s_even = 0;
    s_num = s_pos_num = 0;
}

static const cli_spec plain = {.cmd = "try", .usage = "usage: attnres try\n", .opts = s_opts};
static const cli_spec with_pos = {.cmd = "try", .usage = "usage: attnres try A B\n", .opts = s_opts,
                                  .pos = s_pos, .max_pos = 2, .npos = &s_npos, .extra = "try takes A and B"};
static const cli_spec dash_pos = {.cmd = "db", .opts = s_opts, .pos = s_pos, .max_pos = 2, .npos = &s_npos,
                                  .extra = "note takes RUN and TEXT", .dash_positional = 1};

static void every_kind_of_value(void)
{
    reset();
    int rc = parse(&plain, ARGS("--db", "x.db", "--quiet", "--jobs", "8", "--count", "9000000000", "--eps",
                                "-1.5e-3", "--time", "2.5", "--colour", "blue", "--even", "42"));
    CHECK(rc == CLI_PARSED);
    CHECK(err_text[0] == 0);
    CHECK(s_db && strcmp(s_db, "x.db") == 0);
    CHECK(s_flag == 1);
    CHECK(s_jobs == 8);
    CHECK(s_count == 9000000000LL);
    CHECK(s_seen == 1);
    CHECK(s_num == -1.5e-3);
    CHECK(s_pos_num == 2.5);
    CHECK(s_choice == 2);
    CHECK(s_even == 42);
}

static void nothing_given_changes_nothing(void)
{
    reset();
    s_jobs = 7;
    CHECK(parse(&plain, NO_ARGS) == CLI_PARSED);
    CHECK(s_jobs == 7 && !s_seen && !s_db);
}

static void later_flags_override(void)
{
    reset();
    CHECK(parse(&plain, ARGS("--jobs", "2", "--jobs", "3", "--db", "a", "--db", "b")) == CLI_PARSED);
    CHECK(s_jobs == 3);
    CHECK(strcmp(s_db, "b") == 0);
}

static void help_prints_usage(void)
{
    reset();
    CHECK(parse(&plain, ARGS("--jobs", "2", "--help")) == CLI_HELP);
    CHECK(parse(&plain, ARGS("-h")) == CLI_HELP);
    /* Without a usage (db's subcommands, whose dispatcher answers --help),
     * --help is an unknown option like any other. */
    CHECK(parse(&dash_pos, ARGS("--help")) == -1);
    CHECK(strstr(err_text, "unknown option '--help'"));
}

/* A refusal returns -1 and says each needle. */
static void refused(const cli_spec *spec, const char *const *args, const char *n1, const char *n2)
{
    reset();
    int rc = parse(spec, args);
    CHECK(rc == -1);
    if (!strstr(err_text, n1) || (n2 && !strstr(err_text, n2))) {
        fprintf(stdout, "  message '%s' lacks '%s'%s%s\n", err_text, n1, n2 ? " or " : "", n2 ? n2 : "");
        check_failures++;
    }
}

static void refusals_name_the_flag_and_the_value(void)
{
    refused(&plain, ARGS("--frobnicate"), "attnres try: unknown option '--frobnicate'", "see attnres try --help");
    refused(&plain, ARGS("--jobs"), "--jobs needs a value", NULL);
    refused(&plain, ARGS("--jobs", "0"), "--jobs must be an integer from 1 to 256", "'0'");
    refused(&plain, ARGS("--jobs", "4294967297"), "--jobs must be an integer from 1 to 256", "'4294967297'");
    refused(&plain, ARGS("--jobs", " 8"), "--jobs", "' 8'");
    refused(&plain, ARGS("--count", "-1"), "--count must be an integer from 0 to 9223372036854775807", "'-1'");
    refused(&plain, ARGS("--count", "99999999999999999999"), "--count", "'99999999999999999999'");
    refused(&plain, ARGS("--eps", "small"), "--eps expects a number", "'small'");
    refused(&plain, ARGS("--time", "inf"), "--time must be a positive finite number", "'inf'");
    refused(&plain, ARGS("--time", "0"), "--time must be a positive finite number", "'0'");
    refused(&plain, ARGS("--colour", "mauve"), "--colour must be red, green or blue", "'mauve'");
    refused(&plain, ARGS("--even", "7"), "--even must be even", "'7'");
    refused(&plain, ARGS("stray"), "unexpected argument 'stray'", "see attnres try --help");
    refused(&plain, ARGS("-x"), "unknown option '-x'", NULL);
}

static void a_refused_value_is_not_stored(void)
{
    reset();
    s_jobs = 5;
    CHECK(parse(&plain, ARGS("--jobs", "300")) == -1);
    CHECK(s_jobs == 5);
    CHECK(parse(&plain, ARGS("--count", "x")) == -1);
    CHECK(s_seen == 0);
}

static void positional_arguments(void)
{
    reset();
    CHECK(parse(&with_pos, ARGS("one", "--quiet", "two")) == CLI_PARSED);
    CHECK(s_npos == 2);
    CHECK(strcmp(s_pos[0], "one") == 0 && strcmp(s_pos[1], "two") == 0);
    CHECK(s_flag == 1);
    refused(&with_pos, ARGS("a", "b", "c"), "try takes A and B ('c' is extra)", NULL);
    reset();
    CHECK(parse(&with_pos, ARGS("only")) == CLI_PARSED);
    CHECK(s_npos == 1);
    /* "-" alone is an argument (standard input, by convention). */
    reset();
    CHECK(parse(&with_pos, ARGS("-")) == CLI_PARSED);
    CHECK(s_npos == 1 && strcmp(s_pos[0], "-") == 0);
}

static void dash_positional_and_the_end_of_options(void)
{
    /* A run id or note text may start with one dash; two dashes are still
     * an option. */
    reset();
    CHECK(parse(&dash_pos, ARGS("3", "-5% slower")) == CLI_PARSED);
    CHECK(s_npos == 2 && strcmp(s_pos[1], "-5% slower") == 0);
    refused(&dash_pos, ARGS("3", "--slower"), "unknown option '--slower'", "see attnres db --help");
    /* After "--" everything is an argument, "--quiet" included. */
    reset();
    CHECK(parse(&dash_pos, ARGS("3", "--", "--quiet")) == CLI_PARSED);
    CHECK(s_npos == 2 && strcmp(s_pos[1], "--quiet") == 0);
    CHECK(s_flag == 0);
    /* Without dash_positional, one dash makes an option. */
    refused(&with_pos, ARGS("-5"), "unknown option '-5'", NULL);
}

static void dtype_values(void)
{
    attnres_dtype dt = ATTNRES_DTYPE_F32;
    const cli_opt opts[] = {CLI_OPT_CUSTOM("--dtype", &dt, cli_parse_dtype), CLI_OPT_END};
    const cli_spec spec = {.cmd = "run", .opts = opts};
    CHECK(parse(&spec, ARGS("--dtype", "bf16")) == CLI_PARSED);
    CHECK(dt == ATTNRES_DTYPE_BF16);
    CHECK(parse(&spec, ARGS("--dtype", "f64")) == -1);
    CHECK(strstr(err_text, "--dtype must be f32, bf16 or f16 (got 'f64')"));
    CHECK(dt == ATTNRES_DTYPE_BF16);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (check_usage(argc, argv, 1, "SCRATCH_DIR"))
        return 2;
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", argc == 2 ? argv[1] : ".");
    RUN_CASE(every_kind_of_value);
    RUN_CASE(nothing_given_changes_nothing);
    RUN_CASE(later_flags_override);
    RUN_CASE(help_prints_usage);
    RUN_CASE(refusals_name_the_flag_and_the_value);
    RUN_CASE(a_refused_value_is_not_stored);
    RUN_CASE(positional_arguments);
    RUN_CASE(dash_positional_and_the_end_of_options);
    RUN_CASE(dtype_values);
    CHECK_EXIT();
}
