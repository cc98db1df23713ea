/* db_handle.h - the public attnres_db wraps a read-only ardb connection. */
#ifndef AR_DB_HANDLE_H
#define AR_DB_HANDLE_H

#include <pthread.h>

#include "ardb.h"

/* How many lookups a database handle remembers. A model has a handful of
 * distinct shapes (K3's 186 routing sites have 10), so this holds every
 * lookup of a model load; past it the oldest entry makes room. */
enum { AR_MEMO_ENTRIES = 64, AR_MEMO_KEY = 1024 };

/* One remembered lookup: the problem, device and level it answered (as
 * text), and its winners (count may be 0: a level with none is remembered
 * too, so that a problem that falls back asks once). */
typedef struct ar_memo_entry {
    char key[AR_MEMO_KEY]; /* "" while the slot is free */
    ardb_winner *winners;
    size_t count;
} ar_memo_entry;

/* The lookups made since the file last changed: every plan of a model
 * load but the first of each shape is served from here, with no SQL. */
typedef struct ar_winners_memo {
    int64_t data_version; /* ardb_data_version when the entries were filled */
    int filled;           /* the entries belong to data_version */
    int next;             /* the slot the next new entry takes */
    ar_memo_entry entries[AR_MEMO_ENTRIES];
} ar_winners_memo;

struct attnres_db {
    ardb *db;
    pthread_mutex_t lock; /* one SQLite connection, several planning threads */
    char path[4096];
    ar_winners_memo memo; /* under lock */
};

/* Maps an ardb return code to the public status. */
int ar_status_from_ardb(int rc);

/* The winners of problem q on device d at one fallback level, as
 * ardb_winners_lookup returns them, from the handle's memo when the file
 * has not changed since they were looked up. The caller holds db->lock.
 * *w stays valid until the lock is released; when *owned is not NULL the
 * caller frees it (ardb_winners_free(*owned, *count)) after use: the memo
 * could not keep that answer. Returns an ardb code; on failure the message
 * is in ardb_errmsg(db->db). */
int ar_db_winners(struct attnres_db *db, const ardb_problem *q, const ardb_device *d, ardb_level level,
                  const ardb_winner **w, size_t *count, ardb_winner **owned);

#endif
