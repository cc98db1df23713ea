/*
 * test_stream_steps.h - the check, shared by the CPU and CUDA stream pass
 * tests, that a device refuses a pass with a bad step before it times
 * anything, with a message that names the step and what is wrong with it.
 * Header-only; include check.h and device.h first.
 */
#ifndef ATTNRES_TEST_STREAM_STEPS_H
#define ATTNRES_TEST_STREAM_STEPS_H

#include <stdio.h>

/* A step the pass must refuse, and what its message must say. */
typedef struct test_bad_step {
    ar_stream_step step;
    const char *says;
} test_bad_step;

/* Runs each bad step on dev over buf, as step 1 after `lead` when lead is
 * set, else as step 0: each pass must fail with ATTNRES_EINVAL, leave the
 * time unwritten, and name the step's number and fault. */
static inline void test_bad_steps_refused(attnres_device *dev, void *buf, const ar_stream_step *lead,
                                          const test_bad_step *bad, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ar_stream_pass pass = {{{0}}};
        const int at = lead ? 1 : 0;
        if (lead)
            pass.step[0] = *lead;
        pass.step[at] = bad[i].step;
        double us = -1;
        CHECK(dev->ops->stream_pass(dev, buf, &pass, &us) == ATTNRES_EINVAL && us == -1);
        char what[64], where[64];
        snprintf(what, sizeof what, "bad stream step %zu", i);
        snprintf(where, sizeof where, "stream pass step %d: ", at);
        check_message_has(what, attnres_device_errmsg(dev), where);
        check_message_has(what, attnres_device_errmsg(dev), bad[i].says);
    }
}

#endif
