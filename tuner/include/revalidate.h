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
 * winner of the new run. device_spec NULL means the best device present.
 * Prints a table (and progress on stderr unless quiet). Returns a CLI exit
 * status: 0 when every winner was re-measured and verified, 1 otherwise
 * (including a database with no winner for the device). */
int tune_revalidate(const char *device_spec, const char *db_path, int quiet);

/* A re-measure this many times its record, either way, is more than noise:
 * one of the two was taken on a disturbed machine, or the machine changed.
 * The table says so beside the status and the summary counts them. */
#define REVALIDATE_FAR 1.5

/* 1 when now_us lies beyond REVALIDATE_FAR times stored_us, faster or
 * slower; 0 otherwise, and where either is not a positive time. */
int revalidate_far(double stored_us, double now_us);

#endif
