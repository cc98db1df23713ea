/*
 * errmsg.h - failure messages, kept per thread and per handle.
 *
 * attnres.h promises that after a failed call on a handle, the same thread
 * can read why with attnres_device_errmsg or attnres_plan_errmsg, even
 * while other threads use (and fail on) the same handle. So a message is
 * stored in the failing thread's own storage under the handle's id (a
 * number never reused within the process, so a handle allocated where a
 * destroyed one was does not inherit its message); no lock is taken and no
 * thread can overwrite another's message. Each thread remembers the last
 * AR_ERRMSG_SLOTS handles it failed on.
 */
#ifndef AR_ERRMSG_H
#define AR_ERRMSG_H

#include <stdarg.h>
#include <stdint.h>

#define AR_ERRMSG_SLOTS 4
#define AR_ERRMSG_LEN 1024

/* A new handle id, never 0 and never given out twice. */
uint64_t ar_errmsg_new_id(void);

/* Records the calling thread's message for handle id. The arguments may
 * include the message ar_errmsg_get returned for the same id. */
void ar_errmsg_set(uint64_t id, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ar_errmsg_vset(uint64_t id, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* The calling thread's last message for handle id, "" when it has none.
 * Valid until this thread's next failure. */
const char *ar_errmsg_get(uint64_t id);

/* Drops the calling thread's message for id (the handle is going away). */
void ar_errmsg_forget(uint64_t id);

#endif
