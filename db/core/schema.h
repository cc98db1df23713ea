/*
 * schema.h - the tuning database schema (DESIGN §5), versioned with
 * PRAGMA user_version. Internal to db/.
 */
#ifndef ARDB_SCHEMA_H
#define ARDB_SCHEMA_H

#include "ardb_internal.h"

/* The value of attnres_meta.format that marks an attnres database. */
#define ARDB_FORMAT_MAGIC "attnres-tuning-db"

/* Checks that db->h is an attnres database this build can use. With
 * create != 0 an empty database gets the current schema (race-free between
 * processes: the creation runs in a BEGIN IMMEDIATE transaction that checks
 * again). Returns ARDB_DONE, ENOTDB (not SQLite / not attnres / empty),
 * ENEWER, or an SQLite failure, with the message in db->err. */
int ardb__schema_init(ardb *db, int create);

#endif
