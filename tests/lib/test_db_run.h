/*
 * test_db_run.h - the run the db tests record when the run's own fields
 * do not matter to the case: one set of plausible values (a tester's
 * exhaustive tune), so that what a case checks is what it sets itself.
 * Header-only.
 */
#ifndef ATTNRES_TEST_DB_RUN_H
#define ATTNRES_TEST_DB_RUN_H

#include <stdint.h>
#include <string.h>

#include "ardb_write.h"

/* Begins a run on device device_id with the test values; its id, or 0
 * when ardb refuses it (ardb_errmsg says why). */
static inline int64_t test_run_begin(ardb *db, int64_t device_id)
{
    ardb_run r;
    int64_t id = 0;
    memset(&r, 0, sizeof r);
    r.device_id = device_id;
    r.user = "tester";
    r.host = "localhost";
    r.command = "attnres tune";
    r.project_version = "0.1.0";
    r.compiler = "nvrtc 12.4";
    r.policy_json = "{\"warmup\":10,\"reps\":50}";
    r.strategy = "exhaustive";
    r.copy_gbps = 4300.0;
    r.launch_us = 2.5;
    r.read_gbps = 4100.0;
    if (ardb_run_begin(db, &r, &id) != ARDB_DONE)
        return 0;
    return id;
}

#endif
