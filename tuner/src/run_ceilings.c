/*
 * run_ceilings.c - a tuning run's ceilings: measured once, right before
 * the run's first compile or measurement (or taken from a recent run of
 * the same device in the database --ceilings-from names), or, for a run
 * that finds every candidate on record, carried from the device's latest
 * run that measured them (tune_session.h).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ardb_tools.h"
#include "ceiling_check.h"
#include "tune_session.h"
#include "tuner_base.h"

void tuner_ceilings_record(tuner *t, const ceiling_check *c)
{
    char json[CEILING_CHECK_JSON_SIZE], carried[CEILING_CHECK_JSON_SIZE + 128];
    ceiling_check_json(&t->roof, c, json, sizeof json);
    const char *text = json;
    if (t->roof_carried_from && json[0] == '{') {
        snprintf(carried, sizeof carried, "{\"carried_from_run\": %" PRId64 ", %s", t->roof_carried_from, json + 1);
        text = carried;
    } else if (t->roof_from_uid[0] && json[0] == '{') {
        snprintf(carried, sizeof carried, "{\"carried_from_uid\": \"%s\", %s", t->roof_from_uid, json + 1);
        text = carried;
    }
    if (ardb_run_set_ceilings(t->db, t->run_id, text) != ARDB_DONE) {
        artuner_error("tune", "recording the ceilings: %s", ardb_errmsg(t->db));
        t->unrecorded++;
    }
}

/* Records the run's three figures as its start would have. */
static int record_roofs(tuner *t)
{
    if (ardb_run_set_roofs(t->db, t->run_id, t->roof.copy_gbps, t->roof.read_gbps, t->roof.launch_us) !=
        ARDB_DONE) {
        artuner_error("tune", "recording the ceilings: %s", ardb_errmsg(t->db));
        t->unrecorded++;
        return -1;
    }
    return 0;
}

/* A run uid that fits size bytes and needs no escaping in a JSON string
 * (printable ASCII but quote and backslash; ours are hex digits, a
 * migrated v1 run's "v1:START:HOST:ID"): another file's run is named in
 * this run's record by it. */
static int plain_uid(const char *uid, size_t size)
{
    if (!uid || !uid[0] || strlen(uid) >= size)
        return 0;
    for (const char *c = uid; *c; c++)
        if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\')
            return 0;
    return 1;
}

/* The ceilings of the latest run on this device in opt.ceilings_from that
 * measured them recently, into t->roof: 1, or 0 (logged why) to measure. */
static int take_ceilings_from(tuner *t)
{
    const char *path = t->opt.ceilings_from;
    char msg[512];
    ardb *db = NULL;
    if (ardb_open_readonly(path, &db, msg, sizeof msg) != ARDB_DONE) {
        artuner_log(t, "no ceilings from %s (%s): measuring them", path, msg);
        return 0;
    }
    int64_t from = 0;
    ardb_run_info info;
    memset(&info, 0, sizeof info);
    const char *why = NULL;
    if (ardb_run_latest_measured_ceilings(db, t->dev->fingerprint, TUNE_CEILINGS_FROM_MAX_AGE_S, &from) != ARDB_DONE ||
        ardb_run_get(db, from, &info) != ARDB_DONE)
        why = ardb_errmsg(db);
    else if (!plain_uid(info.uid, sizeof t->roof_from_uid))
        why = "its run's uid is not one this run can record";
    else if (device_ceilings_from_record(info.ceilings, info.copy_gbps, info.read_gbps, info.launch_us, &t->roof))
        why = "its run's ceilings do not read back";
    const int found = why == NULL;
    if (found) {
        snprintf(t->roof_from_uid, sizeof t->roof_from_uid, "%s", info.uid);
        artuner_log(t, "the ceilings are those run %s of %s measured at %s", info.uid, path,
                    info.started_at ? info.started_at : "?");
    } else {
        artuner_log(t, "no ceilings from %s (%s): measuring them", path, why);
    }
    ardb_run_info_clear(&info);
    ardb_close(db);
    return found;
}

int tuner_ceilings_measure(tuner *t)
{
    if (t->roof_ready)
        return 0;
    double c0 = artuner_now_s();
    memset(&t->roof, 0, sizeof t->roof);
    t->roof_from_uid[0] = 0;
    if ((!t->opt.ceilings_from || !take_ceilings_from(t)) && device_ceilings_measure(t->dev, &t->roof) != ATTNRES_OK) {
        artuner_error("tune", "measuring the device: %s", attnres_device_errmsg(t->dev));
        return -1;
    }
    /* The probe's first reading, in the state the ceilings were measured
     * in: later ones are held to it. */
    char why[512];
    if (device_probe_create(t->dev, &t->roof, &t->probe, why, sizeof why) < 0)
        artuner_log(t, "no streaming probe of the device: %s", why);
    device_probe_read(t->dev, t->probe);
    tune_stages_add(&t->stages, STAGE_CEILINGS, artuner_now_s() - c0, 0);
    t->roof_ready = 1;
    t->roof_carried_from = 0;
    char roof[320];
    device_ceilings_format(&t->roof, roof, sizeof roof);
    artuner_log(t, "device %s: %s", t->dev->name, roof);
    if (record_roofs(t))
        return -1;
    tuner_ceilings_record(t, NULL);
    return 0;
}

int tuner_ceilings_carry(tuner *t)
{
    if (t->roof_ready)
        return 0;
    int64_t from = 0;
    ardb_run_info info;
    memset(&info, 0, sizeof info);
    int found = ardb_run_latest_with_ceilings(t->db, t->device_id, t->run_id, &from) == ARDB_DONE &&
                ardb_run_get(t->db, from, &info) == ARDB_DONE &&
                device_ceilings_from_record(info.ceilings, info.copy_gbps, info.read_gbps, info.launch_us, &t->roof) == 0;
    ardb_run_info_clear(&info);
    if (!found)
        return tuner_ceilings_measure(t);
    t->roof_ready = 1;
    t->roof_carried_from = from;
    artuner_log(t, "nothing new to measure: the ceilings are those run %" PRId64 " measured", from);
    if (record_roofs(t))
        return -1;
    tuner_ceilings_record(t, NULL);
    return 0;
}
