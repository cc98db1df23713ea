/*
 * liveness.h - the process that owns a run, and whether it is gone
 * (liveness.c). Internal to db/.
 */
#ifndef ARDB_LIVENESS_H
#define ARDB_LIVENESS_H

#include <stddef.h>

/* This process as a run's owner (runs.owner, schema v5) into buf: 0, or
 * -1 when the system does not tell enough to decide later (no /proc), in
 * which case the run is recorded without an owner. */
int ardb__owner_self(char *buf, size_t len);

/* 1 when the process that owner names has certainly ended (it is on this
 * machine and in this pid namespace, and it no longer runs, is a zombie,
 * its pid now belongs to a process started at another time, or the machine
 * rebooted since); 0 when it runs or this cannot be told. */
int ardb__owner_gone(const char *owner);

#endif
