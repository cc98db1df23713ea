/*
 * fuzz_db_import.c - `attnres db import FILE`: the JSON reader (db/tools/json.c)
 * and the import (db/tools/exchange.c) on any bytes, into a fresh database.
 *
 * Invariants: a refusal is ARDB_EINVAL (or another ardb code) with a
 * message; an accepted file leaves a database whose export is valid UTF-8
 * and valid JSON (what `db export` writes must be readable by any JSON
 * reader, and by ours), and importing that export again adds nothing (the
 * merge semantics the import promises). The CSV exports must succeed too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "fuzz.h"
#include "json.h"
#include "test_buffer.h"
#include "test_utf8.h"

/* A fresh database for every input, so that inputs do not depend on each
 * other, a finding reproduces from its one file, and a child of replay.c
 * never shares a connection or a file with its parent. */
static ardb *fresh_db(void)
{
    char path[1024], msg[512];
    ardb *db = NULL;
    fuzz_remove_db("import.db");
    fuzz_path("import.db", path, sizeof path);
    if (ardb_open(path, ARDB_CREATE, &db, msg, sizeof msg) != ARDB_DONE)
        fuzz_fail("cannot create the scratch database", msg);
    return db;
}

static void check(ardb *db, const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ardb *db = fresh_db();
    check(db, data, size);
    ardb_close(db);
    fuzz_remove_db("import.db");
    return 0;
}

static void check(ardb *db, const uint8_t *data, size_t size)
{
    ardb_merge_stats st;
    int rc = ardb_import_json(db, (const char *)data, size, &st);
    if (rc != ARDB_DONE) {
        fuzz_verdict = FUZZ_REFUSED;
        const char *m = ardb_errmsg(db);
        if (!m || !*m)
            fuzz_fail("refusal without a message", NULL);
        return;
    }
    fuzz_verdict = FUZZ_ACCEPTED;
    buffer out = {0};
    if (ardb_export_json(db, 0, buffer_write, &out) != ARDB_DONE)
        fuzz_fail("export after an accepted import fails", ardb_errmsg(db));
    if (!utf8_valid(out.data, out.len))
        fuzz_fail("the export of an accepted import is not valid UTF-8", NULL);
    ardb_json *doc = NULL;
    char err[256];
    if (ardb__json_parse(out.data, out.len, &doc, err, sizeof err))
        fuzz_fail("the export of an accepted import is not JSON", err);
    ardb__json_free(doc);
    if (ardb_import_json(db, out.data, out.len, &st) != ARDB_DONE)
        fuzz_fail("the export of an accepted import does not import", ardb_errmsg(db));
    if (st.devices || st.problems || st.candidates || st.runs || st.measurements || st.winners)
        fuzz_fail("importing a database's own export added rows", NULL);
    for (int t = ARDB_CSV_MEASUREMENTS; t <= ARDB_CSV_RUNS; t++) {
        buffer csv = {0};
        if (ardb_export_csv(db, (ardb_csv_table)t, buffer_write, &csv) != ARDB_DONE)
            fuzz_fail("CSV export after an accepted import fails", ardb_errmsg(db));
        free(csv.data);
    }
    free(out.data);
}
