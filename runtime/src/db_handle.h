/* db_handle.h - the public attnres_db wraps a read-only ardb connection. */
#ifndef AR_DB_HANDLE_H
#define AR_DB_HANDLE_H

#include <pthread.h>

#include "ardb.h"

struct attnres_db {
    ardb *db;
    pthread_mutex_t lock; /* one SQLite connection, several planning threads */
    char path[4096];
};

/* Maps an ardb return code to the public status. */
int ar_status_from_ardb(int rc);

#endif
