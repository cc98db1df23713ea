/* errmsg.c - per-thread, per-handle failure messages; see errmsg.h. */
#include "errmsg.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

typedef struct slot {
    uint64_t id;   /* 0: free */
    uint64_t used; /* when last written, in this thread's writes */
    char msg[AR_ERRMSG_LEN];
} slot;

static atomic_uint_fast64_t next_id = 1;
static _Thread_local slot slots[AR_ERRMSG_SLOTS];
static _Thread_local uint64_t writes;

uint64_t ar_errmsg_new_id(void)
{
    return (uint64_t)atomic_fetch_add(&next_id, 1);
}

static slot *find(uint64_t id)
{
    for (int i = 0; i < AR_ERRMSG_SLOTS; i++)
        if (slots[i].id == id)
            return &slots[i];
    return NULL;
}

void ar_errmsg_vset(uint64_t id, const char *fmt, va_list ap)
{
    /* Formatted aside first: the arguments may be this very slot's text. */
    char text[AR_ERRMSG_LEN];
    vsnprintf(text, sizeof text, fmt, ap);
    slot *s = find(id);
    if (!s) {
        s = &slots[0];
        for (int i = 1; i < AR_ERRMSG_SLOTS; i++)
            if (slots[i].used < s->used)
                s = &slots[i];
    }
    s->id = id;
    s->used = ++writes;
    memcpy(s->msg, text, sizeof text);
}

void ar_errmsg_set(uint64_t id, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ar_errmsg_vset(id, fmt, ap);
    va_end(ap);
}

const char *ar_errmsg_get(uint64_t id)
{
    const slot *s = id ? find(id) : NULL;
    return s ? s->msg : "";
}

void ar_errmsg_forget(uint64_t id)
{
    slot *s = id ? find(id) : NULL;
    if (s) {
        s->id = 0;
        s->used = 0;
        s->msg[0] = 0;
    }
}
