/* db_handle.c - opening the tuning database for the runtime. */
#include <stdio.h>
#include <stdlib.h>

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

int attnres_db_open(const char *path, attnres_db **out, char *msg, size_t msg_len)
{
    char scratch[8];
    if (!msg) {
        msg = scratch;
        msg_len = sizeof scratch;
    }
    if (!out || !path) {
        snprintf(msg, msg_len, "database path or out is NULL");
        return ATTNRES_EINVAL;
    }
    *out = NULL;
    attnres_db *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(msg, msg_len, "out of memory");
        return ATTNRES_ENOMEM;
    }
    int rc = ardb_open(path, ARDB_READONLY, &h->db, msg, msg_len);
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
    ardb_close(h->db);
    pthread_mutex_destroy(&h->lock);
    free(h);
}
