/*
 * schema.h - what a database file holds (DESIGN §5): the format mark and
 * the schema version, PRAGMA user_version. Internal to db/.
 */
#ifndef ARDB_SCHEMA_H
#define ARDB_SCHEMA_H

#include "ardb_internal.h"

/* The value of attnres_meta.format that marks an attnres database. */
#define ARDB_FORMAT_MAGIC "attnres-tuning-db"

/* What the file holds, read without a write lock. */
typedef struct schema_state {
    int64_t objects;      /* rows of sqlite_schema */
    int64_t user_version;
    int has_meta;         /* attnres_meta table present */
    int format_ok;        /* attnres_meta.format is the magic value */
} schema_state;

/* Reads the state of db->h. Returns ARDB_DONE, ENOTDB (not SQLite) or an
 * SQLite failure, with the message in db->err. */
int ardb__schema_read(ardb *db, schema_state *s);

/* Checks a state read by ardb__schema_read: ENOTDB for an empty file or
 * one that is not an attnres database, ENEWER for a schema newer than this
 * build; ARDB_DONE for any version from 1 to ARDB_SCHEMA_VERSION. */
int ardb__schema_check(ardb *db, const schema_state *s);

/* PRAGMA <schema>.user_version of an attached schema ("main", ...). */
int ardb__user_version(ardb *db, const char *schema, int64_t *version);

/* The schema version of the main database as db reads it: a writer's open
 * migrated the file to ARDB_SCHEMA_VERSION, a read-only handle reads the
 * file's own version. */
int ardb__read_version(ardb *db, int64_t *version);

#endif
