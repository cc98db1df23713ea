/*
 * cmd_db.h - what the `attnres db` subcommands share (cmd_db*.c).
 */
#ifndef TUNER_CMD_DB_H
#define TUNER_CMD_DB_H

#include <stdint.h>
#include <stdio.h>

#include "ardb_tools.h"

/* Opens the database for a subcommand, printing the reason on failure. */
int db_open(const char *path, unsigned flags, ardb **db);

/* Resolves a run as typed (id, latest, latest~K, uid prefix); prints the
 * reason on failure. */
int db_resolve_run(ardb *db, const char *text, int64_t *run_id);

/* JSON output helpers: a quoted, escaped string (NULL: null) and a number
 * (not finite: null). */
void db_json_string(FILE *out, const char *s);
void db_json_number(FILE *out, double v);

/* A short text for one run: "run 3 (revalidate, 2025-01-02 10:11:12)". */
void db_run_label(const ardb_run_info *r, char *buf, size_t len);

/* One run as a JSON object: id, uid, note, times, who, versions, device,
 * policy, roofline and counts. */
void db_print_run_json(FILE *out, const ardb_run_info *r);

/* An output file written whole or not at all: the data go to a temporary
 * beside the target (same directory, so the rename cannot cross file
 * systems), which is flushed to disk and renamed over the target only when
 * everything was written. Until then, and after any failure, the target
 * holds what it held before (or stays absent). */
typedef struct db_out_file {
    char *path; /* the target */
    char *tmp;  /* the temporary, NULL once renamed or removed */
    FILE *f;    /* open while writing */
    int mode;   /* the target's permissions, or 0666 & ~umask for a new one */
} db_out_file;

/* Creates the temporary for path; -1 with the reason printed. */
int db_out_open(db_out_file *o, const char *path);
/* Closes the temporary after writing and syncs it; -1 with the reason
 * printed (the temporary is removed). */
int db_out_close(db_out_file *o);
/* Renames a closed temporary over its target; -1 with the reason printed
 * (the temporary is removed, the target untouched). */
int db_out_commit(db_out_file *o);
/* Removes the temporary (open or closed) and frees o; safe to call after
 * commit, and twice. */
void db_out_discard(db_out_file *o);

int db_cmd_diff(int argc, char **argv);
int db_cmd_regress(int argc, char **argv);
int db_cmd_export(int argc, char **argv);
int db_cmd_import(int argc, char **argv);
int db_cmd_merge(int argc, char **argv);
int db_cmd_plot(int argc, char **argv);

#endif
