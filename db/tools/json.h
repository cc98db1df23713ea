/*
 * json.h - a small JSON reader (RFC 8259) for imports, and the string
 * escaping of the writers. Internal to db/.
 */
#ifndef ARDB_JSON_H
#define ARDB_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum ardb_json_type {
    ARDB_JSON_NULL,
    ARDB_JSON_BOOL,
    ARDB_JSON_NUMBER,
    ARDB_JSON_STRING,
    ARDB_JSON_ARRAY,
    ARDB_JSON_OBJECT
} ardb_json_type;

typedef struct ardb_json ardb_json;
struct ardb_json {
    ardb_json_type type;
    int boolean;
    double number;
    int64_t integer;   /* the number, when it is integral and fits */
    int is_integer;
    char *string;      /* NUL-terminated UTF-8 (may hold NUL bytes) */
    size_t length;     /* string bytes */
    ardb_json *items;  /* array items or object values, count of them */
    char **keys;       /* object keys, parallel to items */
    size_t count;
    int line;          /* where the value starts, for messages */
};

/* Parses text of len bytes into *out (free with ardb__json_free). Returns
 * 0, or -1 with "line N: what" in err. Nesting deeper than 64 is refused. */
int ardb__json_parse(const char *text, size_t len, ardb_json **out, char *err,
                     size_t err_len);
void ardb__json_free(ardb_json *v); /* NULL: no-op */
/* The member of an object by key (the first), or NULL. */
const ardb_json *ardb__json_get(const ardb_json *obj, const char *key);

/* Whether s[0, n) is well-formed UTF-8; when it is not, *bad_at (may be
 * NULL) gets the offset of the first byte that is not. */
int ardb__utf8_valid(const char *s, size_t n, size_t *bad_at);

/* Appends s (n bytes) as a quoted JSON string to a writer through fn;
 * returns fn's first non-zero result. Bytes that are not well-formed UTF-8
 * are written as U+FFFD (one per maximal ill-formed subpart), so the
 * output is always valid JSON. */
typedef int (*ardb_json_out)(void *ctx, const void *data, size_t len);
int ardb__json_write_string(ardb_json_out fn, void *ctx, const char *s,
                            size_t n);

#endif
