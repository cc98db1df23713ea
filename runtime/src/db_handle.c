/*
 * db_handle.c - opening the tuning database for the runtime, and the memo
 * of its lookups.
 *
 * A model load plans every routing site, and most sites share a shape: the
 * memo answers the second plan of a shape without SQL. It is kept exactly
 * as long as SQLite's own page cache would be: every use first asks for the
 * file's data version, and any commit by another connection since the memo
 * was filled empties it, so a plan never gets winners older than the file
 * it starts from.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "db_handle.h"

int ar_status_from_ardb(int rc)
{
    switch (rc) {
    case ARDB_DONE: return ATTNRES_OK;
    case ARDB_EINVAL: return ATTNRES_EINVAL;
    case ARDB_ENOMEM: return ATTNRES_ENOMEM;
    case ARDB_ENEWER: return ATTNRES_EDBVERSION;
    case ARDB_ENOTFOUND: return ATTNRES_ENOTFOUND;
    default: return ATTNRES_EDB;
    }
}

/* ---- the memo of lookups ------------------------------------------------ */

static void memo_clear(ar_winners_memo *m)
{
    for (int i = 0; i < AR_MEMO_ENTRIES; i++) {
        ar_memo_entry *e = &m->entries[i];
        ardb_winners_free(e->winners, e->count);
        e->winners = NULL;
        e->count = 0;
        e->key[0] = 0;
    }
    m->next = 0;
    m->filled = 0;
}

static const char *or_empty(const char *s) { return s ? s : ""; }

/* The memo's key: everything the lookup's answer depends on. The device's
 * strings carry their lengths, so that no two devices share a key. Returns
 * 0, or -1 when the key does not fit (then the lookup is not remembered). */
static int memo_key(const ardb_problem *q, const ardb_device *d, ardb_level level, char key[AR_MEMO_KEY])
{
    const char *backend = or_empty(d->backend), *arch = or_empty(d->arch), *fp = or_empty(d->fingerprint);
    int n = snprintf(key, AR_MEMO_KEY,
                     "%s:%s:%s:d%" PRId64 ":n%" PRId32 ":h%" PRId32 ":epi%" PRId32 ":s%" PRId32
                     "|level %d|sim %d|%zu:%s|%zu:%s|%zu:%s",
                     or_empty(q->op), or_empty(q->dtype), or_empty(q->form), q->d, q->n, q->heads, q->epilogue,
                     q->s, (int)level, d->simulated ? 1 : 0, strlen(backend), backend, strlen(arch), arch,
                     strlen(fp), fp);
    return n > 0 && n < AR_MEMO_KEY ? 0 : -1;
}

static ar_memo_entry *memo_find(ar_winners_memo *m, const char *key)
{
    for (int i = 0; i < AR_MEMO_ENTRIES; i++)
        if (m->entries[i].key[0] && strcmp(m->entries[i].key, key) == 0)
            return &m->entries[i];
    return NULL;
}

/* Keeps an answer, in place of the oldest one when the memo is full. */
static void memo_add(ar_winners_memo *m, const char *key, ardb_winner *w, size_t count)
{
    ar_memo_entry *e = &m->entries[m->next];
    m->next = (m->next + 1) % AR_MEMO_ENTRIES;
    ardb_winners_free(e->winners, e->count);
    snprintf(e->key, sizeof e->key, "%s", key);
    e->winners = w;
    e->count = count;
}

/* Empties the memo when the file changed since it was filled. */
static int memo_check(attnres_db *db)
{
    int64_t version = 0;
    int rc = ardb_data_version(db->db, &version);
    if (rc != ARDB_DONE) {
        memo_clear(&db->memo);
        return rc;
    }
    if (!db->memo.filled || db->memo.data_version != version) {
        memo_clear(&db->memo);
        db->memo.data_version = version;
        db->memo.filled = 1;
    }
    return ARDB_DONE;
}

int ar_db_winners(attnres_db *db, const ardb_problem *q, const ardb_device *d, ardb_level level,
                  const ardb_winner **w, size_t *count, ardb_winner **owned)
{
    *w = NULL;
    *count = 0;
    *owned = NULL;
    /* The version is read before the lookup: a commit in between makes the
     * next check empty the memo, which costs a lookup, never freshness. */
    int rc = memo_check(db);
    if (rc != ARDB_DONE)
        return rc;
    char key[AR_MEMO_KEY];
    const int keyed = memo_key(q, d, level, key) == 0;
    const ar_memo_entry *e = keyed ? memo_find(&db->memo, key) : NULL;
    if (e) {
        *w = e->winners;
        *count = e->count;
        return ARDB_DONE;
    }
    ardb_winner *found = NULL;
    size_t n = 0;
    rc = ardb_winners_lookup(db->db, q, d, level, &found, &n);
    if (rc != ARDB_DONE)
        return rc;
    if (keyed)
        memo_add(&db->memo, key, found, n);
    else
        *owned = found;
    *w = found;
    *count = n;
    return ARDB_DONE;
}

/* ---- open and close ---------------------------------------------------- */

int attnres_db_open(const char *path, attnres_db **out, char *msg, size_t msg_len)
{
    char scratch[8];
    if (!msg) {
        msg = scratch;
        msg_len = sizeof scratch;
    }
    if (out)
        *out = NULL; /* on every failure, a caller's handle is NULL */
    if (!out || !path) {
        snprintf(msg, msg_len, "%s is NULL", out ? "the database path" : "out");
        return ATTNRES_EINVAL;
    }
    attnres_db *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(msg, msg_len, "out of memory");
        return ATTNRES_ENOMEM;
    }
    int rc = ardb_open_readonly(path, &h->db, msg, msg_len);
    if (rc != ARDB_DONE) {
        free(h);
        return ar_status_from_ardb(rc);
    }
    pthread_mutex_init(&h->lock, NULL);
    snprintf(h->path, sizeof h->path, "%s", path);
    *out = h;
    return ATTNRES_OK;
}

void attnres_db_close(attnres_db *h)
{
    if (!h)
        return;
    memo_clear(&h->memo);
    ardb_close(h->db);
    pthread_mutex_destroy(&h->lock);
    free(h);
}
