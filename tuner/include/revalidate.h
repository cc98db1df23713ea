/*
 * revalidate.h - `attnres tune --revalidate`: re-measures the stored
 * winners of a device, and nothing else, as a new run (strategy
 * "revalidate") that `attnres db regress` compares with any other.
 */
#ifndef TUNER_REVALIDATE_H
#define TUNER_REVALIDATE_H

/* For every problem with a stored winner for the device (chosen as the
 * runtime chooses: same fingerprint, else same architecture, else same
 * backend; the newest run's), loads the winner's binary for the device's
 * current compiler (compiling the stored source when the database holds no
 * binary for that build key), verifies it against the reference on fresh
 * inputs, times it, and records a measurement and, when it verifies, the
 * winner of the new run.
 *
 * A provisional winner (schema v9: the final round that chose it was
 * disturbed on every try) is decided again instead: the finalists that
 * round timed ok, itself among them, are verified and timed interleaved as
 * the tuner's final round times them (final_round.h; a disturbed round is
 * timed again up to `retries` times), every timing is recorded as one of a
 * final round, and the winner of that round is recorded as the new run's,
 * provisional again only if this round too was disturbed on every try.
 * Its row says what was found and done ("stored under disturbance (...);
 * now 193.00 us; re-decided: V (kept), of 3 finalist(s) timed
 * interleaved").
 *
 * device_spec names the device ("cpu", "cuda:0"; the command line picks
 * its default). Prints a table (and progress on stderr unless quiet).
 * Returns ARTUNER_EXIT_OK when every stored winner was re-measured and
 * verified, ARTUNER_EXIT_FAIL otherwise (including a database with no
 * winner for the device). */
int tune_revalidate(const char *device_spec, const char *db_path, int quiet, int retries);

/* A re-measure this many times its record, either way, is more than noise:
 * one of the two was taken on a disturbed machine, or the machine changed.
 * The table says so beside the status and the summary counts them. */
#define REVALIDATE_FAR 1.5

/* 1 when now_us lies beyond REVALIDATE_FAR times stored_us, faster or
 * slower; 0 otherwise, and where either is not a positive time. */
int revalidate_far(double stored_us, double now_us);

#endif
