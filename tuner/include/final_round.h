/*
 * final_round.h - the interleaved round that decides between finalists:
 * how many rounds it takes on a device, how long each finalist's share of
 * a round is, and what is done when other work on the machine disturbed
 * it (docs/tuning.md, "Disturbance"). The tuner's search (search.c) times
 * a problem's finalists this way, and so does `attnres tune --revalidate`
 * when it decides a provisional winner again (revalidate.c), so that the
 * second decision is taken as the first was.
 */
#ifndef TUNER_FINAL_ROUND_H
#define TUNER_FINAL_ROUND_H

#include <stddef.h>

#include "attnres-impl.h"
#include "device_probe.h"
#include "disturbance.h"
#include "isolate.h"
#include "measure.h"

/* Each finalist's share of a round is a batch of launches of about 2 ms,
 * since one 100 us launch times the wake-up of the device's workers as
 * much as the kernel. Fifteen rounds on the CPU cost about a second at
 * T = 4096. */
#define FINAL_ROUND_US 2000.0
#define FINAL_ROUNDS_CPU 15
/* A round that other work disturbed is timed again after this pause, so
 * that a burst of other work can end first. */
#define FINAL_RETRY_PAUSE_S 2

/* How a final round went. */
typedef struct final_verdict {
    int tries;              /* times the round was timed */
    int disturbed;          /* of those, how many other work disturbed */
    int provisional;        /* the last try, the one recorded, was disturbed
                               too: its winner is provisional */
    char disturbance[224];  /* what the last disturbed try showed; "" when
                               none was */
} final_verdict;

/* One try of a round: times it and returns what other work took from its
 * window (disturbance.h). */
typedef disturbance (*final_try_fn)(void *ctx);
/* Receives each note of the retry policy: one line, no newline. */
typedef void (*final_note_fn)(void *ctx, const char *line);

/* The retry policy alone, so that its decisions can be checked on given
 * figures: tries the round; while a try is disturbed (disturbance_found)
 * and fewer than `retries` retries were taken, notes it, pauses pause_s
 * seconds and tries again. The last try is the one recorded: when it was
 * disturbed too, the verdict is provisional. watch 0 takes one try and
 * never finds a disturbance (a simulated device's times are a model).
 * note may be NULL. */
void final_retry(final_try_fn try_round, void *try_ctx, int retries, unsigned pause_s, int watch,
                 final_note_fn note, void *note_ctx, final_verdict *v);

/* The rounds of a final round on dev: 3 on a simulated device (its times
 * are a deterministic model, so a few decide as well as many, and each
 * costs an interpreted run), FINAL_ROUNDS_CPU on the CPU, 31 on a GPU. */
int final_rounds(const attnres_device *dev);

/* Times k finalists interleaved for final_rounds(dev) rounds
 * (job_interleave), each finalist's share of a round a batch of about
 * FINAL_ROUND_US (one launch on a simulated device), under final_retry
 * with FINAL_RETRY_PAUSE_S. opt gives the rest (policy, isolation, time
 * limit, the streaming pass that closes each round); its round_us is
 * replaced. probe (NULL: none) is read after each try, and a try after
 * which it read far below its usual counts as disturbed. res gets
 * the last try's k results. */
void final_interleave(attnres_device *dev, bench_case *bc, const job_kernel *ks, size_t k, const job_options *opt,
                      device_probe *probe, int retries, final_note_fn note, void *note_ctx, job_result *res,
                      final_verdict *v);

/* The message recorded with a finalist's timing of a final round of k
 * finalists and `rounds` rounds: "final (interleaved with K, R rounds)",
 * with the finalist's share of the streaming pass where one closed each
 * round. Readers of files before schema v8 tell a final timing by its
 * first word. */
void final_message(const job_result *r, size_t k, int rounds, char *buf, size_t len);

#endif
