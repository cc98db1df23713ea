/*
 * test_problems.c - the problems-file parser (tuner/src/problems.c): the
 * example in docs/problems.md parses to the problems the page says, and
 * every field is range-checked by name instead of being truncated (a file
 * with N = 4294967298 used to tune N = 2).
 *
 * usage: test_problems DOCS/problems.md SCRATCH_DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "problems.h"
#include "test_files.h"

static const char *doc_path;
static char scratch[1024], path[1200], err[512];

static void write_file(const char *text, size_t len)
{
    snprintf(path, sizeof path, "%s/problems.txt", scratch);
    if (file_write(path, text, len) != 0) {
        perror(path);
        exit(2);
    }
}

/* The fenced block after the marker comment of docs/problems.md. */
static void test_doc_example_parses(void)
{
    FILE *f = fopen(doc_path, "r");
    REQUIRE(f != NULL);
    char line[4200], block[16384] = "";
    int state = 0; /* 0: before the marker, 1: before the fence, 2: in the block, 3: done */
    size_t used = 0;
    while (state < 3 && fgets(line, sizeof line, f)) {
        if (state == 0 && strstr(line, "<!-- problems-example:"))
            state = 1;
        else if (state == 1 && strncmp(line, "```", 3) == 0)
            state = 2;
        else if (state == 2 && strncmp(line, "```", 3) == 0)
            state = 3;
        else if (state == 2 && used + strlen(line) < sizeof block)
            used += (size_t)snprintf(block + used, sizeof block - used, "%s", line);
    }
    fclose(f);
    REQUIRE(state == 3);
    write_file(block, used);
    problem_set set;
    if (problems_read_file(path, &set, err, sizeof err) != 0) {
        fprintf(stderr, "the example of %s does not parse: %s\n", doc_path, err);
        check_failures++;
        return;
    }
    /* The page says: six lines, 13 problems. */
    CHECK(set.count == 13);
    if (set.count == 13) {
        const tune_problem *t = set.items;
        CHECK(t[0].p.op == ATTNRES_OP_MIX && t[0].p.dtype == ATTNRES_DTYPE_BF16 && t[0].p.d == 7168 &&
              t[0].p.n == 9 && t[0].p.heads == 1 && t[0].t == 1 && t[2].t == 4096);
        CHECK(t[3].p.heads == 8 && t[3].p.d == 4096 && t[4].t == 4096);
        CHECK(t[5].p.form == ATTNRES_FORM_ADDITIVE && t[5].p.epilogue == 1 && t[5].p.dtype == ATTNRES_DTYPE_F32);
        CHECK(t[7].p.op == ATTNRES_OP_PHASE1 && t[7].p.s == 24 && t[7].p.n == 8 && t[8].t == 64);
        CHECK(t[9].p.op == ATTNRES_OP_PHASE2 && t[9].p.fuse_add == 1 && t[11].t == 4096);
        CHECK(t[12].p.op == ATTNRES_OP_PHASE2 && t[12].p.dtype == ATTNRES_DTYPE_F16 && t[12].p.heads == 4 &&
              t[12].p.epilogue == 1 && t[12].p.fuse_add == 0 && t[12].t == 16);
    }
    problems_free(&set);
}

static void expect_refused_n(const char *what, const char *text, size_t len, const char *needle)
{
    write_file(text, len);
    problem_set set;
    err[0] = 0;
    if (problems_read_file(path, &set, err, sizeof err) == 0) {
        fprintf(stderr, "%s: accepted (%zu problems, first N = %d, T = %lld)\n", what, set.count,
                set.count ? set.items[0].p.n : 0, set.count ? (long long)set.items[0].t : 0LL);
        check_failures++;
        problems_free(&set);
        return;
    }
    check_message_has(what, err, needle);
    CHECK(set.items == NULL && set.count == 0);
}

static void expect_refused(const char *what, const char *text, const char *needle)
{
    expect_refused_n(what, text, strlen(text), needle);
}

static void test_fields_are_range_checked(void)
{
    expect_refused("N beyond 32 bits", "mix f32 64 4294967298 1 replace 0 1\n",
                   ":1: N must be an integer from 1 to 1048576 (got '4294967298')");
    expect_refused("N beyond int64", "mix f32 64 99999999999999999999 1 replace 0 1\n", "N must be");
    expect_refused("heads beyond 32 bits", "mix f32 64 3 4294967297 replace 0 1\n", "heads must be an integer from 1");
    expect_refused("d too large", "mix f32 4294967360 3 1 replace 0 1\n", "d must be an integer from 1 to 16777216");
    expect_refused("epilogue 2", "mix f32 64 3 1 replace 2 1\n", "epilogue must be an integer from 0 to 1");
    expect_refused("epilogue beyond 32 bits", "mix f32 64 3 1 replace 4294967297 1\n", "epilogue");
    expect_refused("T too large", "mix f32 64 3 1 replace 0 1,16777217\n", "T bucket must be an integer from 1");
    expect_refused("T zero", "mix f32 64 3 1 replace 0 0\n", "T bucket");
    expect_refused("s beyond 32 bits", "phase1 f32 64 3 1 replace 0 1 s=4294967297\n", "s (sites per block)");
    expect_refused("fuse 2", "phase2 f32 64 1 1 replace 0 1 fuse=2\n", "fuse must be an integer from 0 to 1");
    expect_refused("fuse beyond 32 bits", "phase2 f32 64 1 1 replace 0 1 fuse=4294967297\n", "fuse must be");
    expect_refused("a sign", "mix f32 +64 3 1 replace 0 1\n", "d must be");
    expect_refused("junk after digits", "mix f32 64x 3 1 replace 0 1\n", "d must be");
}

static void test_lines_are_read_whole(void)
{
    expect_refused("an empty bucket", "mix f32 64 3 1 replace 0 1,,64\n", "empty T bucket");
    expect_refused("a trailing comma", "mix f32 64 3 1 replace 0 1,64,\n", "empty T bucket");
    expect_refused("a repeated bucket", "mix f32 64 3 1 replace 0 64,64\n", "listed twice");
    expect_refused("a token after the options", "phase1 f32 64 3 1 replace 0 1 s=2 fuse=0 extra\n", "unexpected");
    expect_refused("an option twice", "phase1 f32 64 3 1 replace 0 1 s=2 s=3\n", "given twice");
    expect_refused("an unknown option", "mix f32 64 3 1 replace 0 1 S=2\n", "unknown option");
    expect_refused("too few fields", "mix f32 64 3 1 replace 0\n", "expected 'op dtype");
    expect_refused("s= on mix", "mix f32 64 3 1 replace 0 1 s=2\n", "only meaningful for phase1");
    expect_refused("phase1 without s=", "phase1 f32 64 3 1 replace 0 1\n", "phase1 needs S");
    expect_refused("a comment only", "# nothing here\n\n   \n", "lists no problems");
    static const char nul[] = "mix f32 64 3 1 replace 0 1\0 junk\n";
    expect_refused_n("a NUL byte", nul, sizeof nul - 1, "NUL");
    char longline[6000];
    memset(longline, ' ', sizeof longline);
    memcpy(longline, "mix f32 64 3 1 replace 0 1", 26);
    memcpy(longline + sizeof longline - 30, " 64\n", 5);
    expect_refused("a line over 4096 characters", longline, "longer than 4096");
    expect_refused("the second line's number", "mix f32 64 3 1 replace 0 1\nmix f32 64 0 1 replace 0 1\n", ":2:");
}

static void test_accepted_forms(void)
{
    const char *text = "mix f32 64 3 1 replace 0 1 # a comment\n"
                       "\tmix\tbf16\t64\t3\t2\tadditive\t1\t1,7 fuse=0\r\n"
                       "phase1 f32 64 3 1 replace 0 5 s=4096\n";
    write_file(text, strlen(text));
    problem_set set;
    if (problems_read_file(path, &set, err, sizeof err) != 0) {
        fprintf(stderr, "refused: %s\n", err);
        check_failures++;
        return;
    }
    CHECK(set.count == 4);
    CHECK(set.count == 4 && set.items[2].t == 7 && set.items[2].p.heads == 2 && set.items[3].p.s == 4096);
    problems_free(&set);
}

/* The phases' backwards: the fields of their forwards, the same checks,
 * and phase 2's fused add recorded as the form "fused". */
static void test_backward_ops(void)
{
    const char *text = "phase1_backward bf16 7168 8 1 replace 0 1,64 s=24\n"
                       "phase2_backward bf16 7168 1 1 replace 1 64 fuse=1\n"
                       "phase2_backward f32 64 1 2 replace 0 3\n";
    write_file(text, strlen(text));
    problem_set set;
    if (problems_read_file(path, &set, err, sizeof err) != 0) {
        fprintf(stderr, "refused: %s\n", err);
        check_failures++;
        return;
    }
    CHECK(set.count == 4);
    if (set.count == 4) {
        const tune_problem *t = set.items;
        CHECK(t[0].p.op == ATTNRES_OP_PHASE1_BACKWARD && t[0].p.s == 24 && t[0].p.n == 8 && t[1].t == 64);
        CHECK(t[2].p.op == ATTNRES_OP_PHASE2_BACKWARD && t[2].p.fuse_add == 1 && t[2].p.epilogue == 1);
        CHECK(t[3].p.op == ATTNRES_OP_PHASE2_BACKWARD && t[3].p.fuse_add == 0 && t[3].p.heads == 2);
        CHECK(strcmp(problem_op_name(t[0].p.op), "phase1_backward") == 0);
        CHECK(strcmp(problem_form_name(&t[2].p), "fused") == 0 && strcmp(problem_form_name(&t[3].p), "replace") == 0);
        char desc[128];
        problem_describe(&t[2], desc, sizeof desc);
        CHECK(strcmp(desc, "phase2_backward bf16 d=7168 H=1 fused+norm T=64") == 0);
        problem_describe(&t[1], desc, sizeof desc);
        CHECK(strcmp(desc, "phase1_backward bf16 d=7168 N=8 S=24 H=1 replace T=64") == 0);
    }
    problems_free(&set);
    attnres_op op;
    CHECK(problem_op_parse("phase2_backward", &op) == 0 && op == ATTNRES_OP_PHASE2_BACKWARD);
    CHECK(problem_op_parse("phase3_backward", &op) == -1);
    expect_refused("an unknown op", "phase3_backward f32 64 1 1 replace 0 1\n",
                   "is not mix, phase1, phase2, mix_backward, phase1_backward or phase2_backward");
    expect_refused("phase1_backward without s=", "phase1_backward f32 64 3 1 replace 0 1\n", "phase1_backward needs S");
    expect_refused("phase1_backward with the epilogue", "phase1_backward f32 64 3 1 replace 1 1 s=2\n",
                   "no output-norm epilogue");
    expect_refused("phase2_backward additive", "phase2_backward f32 64 1 1 additive 0 1\n", "no additive form");
    expect_refused("s= on phase2_backward", "phase2_backward f32 64 1 1 replace 0 1 s=2\n",
                   "only meaningful for phase1");
    expect_refused("fuse=1 on phase1_backward", "phase1_backward f32 64 3 1 replace 0 1 s=2 fuse=1\n",
                   "only meaningful for phase2");
    expect_refused("phase1_backward's S beyond the limit", "phase1_backward f32 64 3 1 replace 0 1 s=4097\n",
                   "s (sites per block) must be an integer from 1 to 4096");
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (check_usage(argc, argv, 2, "DOCS/problems.md SCRATCH_DIR"))
        return 2;
    doc_path = argc == 3 ? argv[1] : "";
    snprintf(scratch, sizeof scratch, "%s", argc == 3 ? argv[2] : ".");
    RUN_CASE(test_doc_example_parses);
    RUN_CASE(test_fields_are_range_checked);
    RUN_CASE(test_lines_are_read_whole);
    RUN_CASE(test_accepted_forms);
    RUN_CASE(test_backward_ops);
    CHECK_EXIT();
}
