/*
 * migrate.h - the creation of the schema, the versions after v1 and the
 * in-place migration of older files: what a writer's open does to a file
 * (db/write). Internal to db/.
 *
 * Each version after v1 is a delta script: a new database runs the v1 DDL
 * and then every delta, in the transaction that creates it, so a new file
 * and a migrated one have the same shape by construction.
 */
#ifndef ARDB_MIGRATE_H
#define ARDB_MIGRATE_H

#include <stdint.h>

#include "ardb_internal.h"
#include "schema.h"

/* The identity that schema v2 gives a run recorded under v1 (no uid
 * column): derived from what v1 recorded, so that the migration and a merge
 * from a v1 file that was never migrated agree. `r` is the alias of the
 * runs table in the statement. */
#define ARDB_LEGACY_RUN_UID(r)                                                \
    "printf('v1:%s:%s:%d', " r ".started_at, COALESCE(" r ".host, ''), " r    \
    ".id)"

/* Whether a measurement recorded before schema v8 (no final_round column)
 * was taken in a final round: its message starts with "final", as the
 * tuner wrote it then. The migration to v8 sets the column from this, and
 * readers of an older file opened read-only, merges and imports from one
 * use it, so that they all agree. `message` is the SQL expression of the
 * measurement's message. */
#define ARDB_LEGACY_FINAL_ROUND(message)                                      \
    "COALESCE(substr(" message ", 1, 5) = 'final', 0)"

/* Runs the deltas that take a database from version `from` to
 * ARDB_SCHEMA_VERSION, on the caller's open transaction. No backup. */
int ardb__schema_upgrade(ardb *db, int64_t from);

/* Migrates the file of a read-write handle whose user_version is older than
 * ARDB_SCHEMA_VERSION, in place: under BEGIN IMMEDIATE it checks the version
 * again (another process may have migrated it), copies the file to
 * "PATH.v<old>.bak" (or "PATH.v<old>.bak.<k>" when that name is taken),
 * runs the deltas, checks that every reference between rows still holds
 * (foreign keys are off while the deltas run, since a delta may rebuild a
 * table) and commits. A failure leaves the file as it was. */
int ardb__migrate(ardb *db, int64_t from);

/* Checks that db->h is an attnres database this build can write. With
 * create != 0 an empty database gets the current schema (race-free between
 * processes: the creation runs in a BEGIN IMMEDIATE transaction that checks
 * again); an older one is migrated (ardb__migrate). Returns ARDB_DONE,
 * ENOTDB (not SQLite / not attnres / empty), ENEWER, or an SQLite failure,
 * with the message in db->err. */
int ardb__schema_init(ardb *db, int create);

#endif
