/*
 * fuzz_problems.c - the problems-file reader of `attnres tune --problems`
 * (tuner/src/problems.c).
 *
 * Invariants: a refusal has a message and an empty set; every accepted
 * problem passes the runtime's own attnres_problem_check (what the tuner
 * hands to the runtime must be valid), has a T bucket of at least one
 * token, and can be described.
 */
#include <stdio.h>
#include <string.h>

#include "attnres.h"
#include "fuzz.h"
#include "problems.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024], err[512];
    fuzz_write_file("problems.txt", data, size, path, sizeof path);
    problem_set set;
    err[0] = '\0';
    if (problems_read_file(path, &set, err, sizeof err) != 0) {
        fuzz_verdict = FUZZ_REFUSED;
        if (!err[0])
            fuzz_fail("refusal without a message", NULL);
        if (set.items || set.count)
            fuzz_fail("refusal leaves a non-empty set", err);
        problems_free(&set);
        return 0;
    }
    fuzz_verdict = FUZZ_ACCEPTED;
    if (set.count && !set.items)
        fuzz_fail("accepted set without items", NULL);
    for (size_t i = 0; i < set.count; i++) {
        char msg[256], desc[256];
        if (attnres_problem_check(&set.items[i].p, msg, sizeof msg) != ATTNRES_OK)
            fuzz_fail("accepted a problem the runtime refuses", msg);
        if (set.items[i].t < 1)
            fuzz_fail("accepted a T bucket below 1", NULL);
        problem_describe(&set.items[i], desc, sizeof desc);
        (void)problem_bytes(&set.items[i]);
    }
    problems_free(&set);
    return 0;
}
