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
/* The same as a further member of an object: `, "key": value`. */
void db_json_string_member(FILE *out, const char *key, const char *s);
void db_json_number_member(FILE *out, const char *key, double v);

/* A short text for one run: "run 3 (revalidate, 2025-01-02 10:11:12)". */
void db_run_label(const ardb_run_info *r, char *buf, size_t len);

/* One run as a JSON object: id, uid, note, times, who, versions, device,
 * policy, ceilings and counts. */
void db_print_run_json(FILE *out, const ardb_run_info *r);

int db_cmd_diff(int argc, char **argv);
int db_cmd_regress(int argc, char **argv);
int db_cmd_export(int argc, char **argv);
int db_cmd_import(int argc, char **argv);
int db_cmd_merge(int argc, char **argv);
int db_cmd_plot(int argc, char **argv);

#endif
