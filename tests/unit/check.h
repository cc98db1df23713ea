/*
 * check.h - the minimal assertion helpers of the C unit tests.
 *
 * A test program runs its cases, prints one "ok"/"FAIL" line per check that
 * fails or per case, and exits non-zero when any check failed, so that ctest
 * counts it. CHECK continues after a failure; REQUIRE returns from the case.
 */
#ifndef CHECK_H
#define CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures;

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            check_failures++;                                                \
        }                                                                    \
    } while (0)

#define REQUIRE(cond)                                                        \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: required: %s\n", __FILE__, __LINE__,     \
                    #cond);                                                  \
            check_failures++;                                                \
            return;                                                          \
        }                                                                    \
    } while (0)

#define RUN_CASE(fn)                                                         \
    do {                                                                     \
        int before_ = check_failures;                                        \
        fn();                                                                \
        printf("%s %s\n", check_failures == before_ ? "ok  " : "FAIL", #fn); \
    } while (0)

#define CHECK_EXIT()                                                         \
    do {                                                                     \
        printf("%d check(s) failed\n", check_failures);                      \
        return check_failures ? 1 : 0;                                       \
    } while (0)

#endif
