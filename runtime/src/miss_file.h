/*
 * miss_file.h - the record of untuned problems (attnres_miss_file_set,
 * ATTNRES_MISS_FILE), written by the runtime and read by
 * `attnres tune --from-misses`.
 *
 * One line per problem, device and T bucket, appended with one write(2)
 * of the whole line on a descriptor opened with O_APPEND, so lines of
 * several processes never interleave:
 *
 *   attnres-miss 1 sum=1a2b3c4d op=mix dtype=bf16 d=7168 n=9 heads=1 s=0 form=replace epilogue=0 fuse=0 t=64 device=FINGERPRINT
 *
 * sum is the FNV-1a hash (32 bits, hex) of the text from "op=" to the end
 * of the line (without its newline). The fields come in this order, each
 * once; t is the run's T rounded up to a power of two; device is the
 * device fingerprint (printable ASCII, to the end of the line). A last
 * line without its newline is a write cut short: readers skip it. A writer
 * that finds one closes it and marks it with the line "attnres-miss cut"
 * before its own, and readers skip a line so marked (and the mark).
 */
#ifndef ATTNRES_MISS_FILE_H
#define ATTNRES_MISS_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "attnres.h"

#define AR_MISS_LINE_MAX 1024            /* bytes of one line, newline included */
#define AR_MISS_FILE_MAX ((int64_t)1 << 20) /* the writer appends nothing past 1 MiB */
#define AR_MISS_READ_MAX ((int64_t)4 << 20) /* the reader refuses larger files */
#define AR_MISS_MAX_T ((int64_t)1 << 24)   /* T buckets above are recorded as this */

/* What a plan that fell back keeps for recording its runs. */
typedef struct ar_miss_site {
    int armed;      /* 1: the plan runs a built-in kernel */
    uint64_t seen;  /* bit b: bucket 2^b recorded (or tried); atomic */
    char key[AR_MISS_LINE_MAX]; /* the line from "op=" up to " t=", without t */
    char device[700];
} ar_miss_site;

/* Arms site for a plan of problem p on the device with this fingerprint. */
void ar_miss_site_arm(ar_miss_site *site, const attnres_problem *p, const char *fingerprint);

/* The hot path's part: records T's bucket the first time the plan meets
 * it, when a miss file is set. Otherwise one atomic load. Never fails. */
void ar_miss_site_note(ar_miss_site *site, int64_t T);

/* The miss file now in force (the API's, else ATTNRES_MISS_FILE), copied
 * to buf; 0 if there is one, -1 if recording is off. */
int ar_miss_file_path(char *buf, size_t len);

/* 0 with the reason in why when path names something that is not a
 * regular file (a FIFO, a device, a directory), which the writer never
 * opens for writing; 1 otherwise. For the plan's explanation: it only
 * stats the path, so it never blocks on a FIFO. */
int ar_miss_file_usable(const char *path, char *why, size_t why_len);

/* One parsed line. */
typedef struct ar_miss {
    attnres_problem p;
    int64_t t;
    char device[640];
} ar_miss;

/* Parses one line (len bytes, no newline). 0 on success; -1 with the
 * reason in err. */
int ar_miss_parse_line(const char *line, size_t len, ar_miss *out, char *err, size_t err_len);

/* Formats the line of a miss into buf (newline included); its length, or
 * -1 if it does not fit or the miss is not one the parser accepts. */
int ar_miss_format_line(const ar_miss *m, char *buf, size_t len);

/* Reads a miss file: every complete line must parse (else -1 and
 * "PATH:LINE: what is wrong" in err, *out NULL); equal lines are kept once,
 * in order of first appearance. *torn counts the lines skipped as cut
 * short (a last line without its newline, or a line marked cut). *out is
 * malloc'ed (free it); 0 on success. */
int ar_miss_read_file(const char *path, ar_miss **out, size_t *count, int *torn, char *err, size_t err_len);

#endif
