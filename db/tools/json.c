/* json.c - see json.h. */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct parser {
    const char *p, *end;
    int line;
    char *err;
    size_t err_len;
    int failed;
} parser;

static int fail(parser *ps, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int fail(parser *ps, const char *fmt, ...)
{
    va_list ap;
    int n;
    if (ps->failed)
        return -1;
    ps->failed = 1;
    if (!ps->err || !ps->err_len)
        return -1;
    n = snprintf(ps->err, ps->err_len, "line %d: ", ps->line);
    if (n < 0 || (size_t)n >= ps->err_len)
        return -1;
    va_start(ap, fmt);
    vsnprintf(ps->err + n, ps->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static void skip_space(parser *ps)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '\n')
            ps->line++;
        else if (c != ' ' && c != '\t' && c != '\r')
            return;
        ps->p++;
    }
}

static void free_members(ardb_json *v)
{
    size_t i;
    if (!v)
        return;
    free(v->string);
    for (i = 0; i < v->count; i++) {
        free_members(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
}

void ardb__json_free(ardb_json *v)
{
    if (!v)
        return;
    free_members(v);
    free(v);
}

static int parse_value(parser *ps, ardb_json *v, int depth);

/* Appends one byte to a growing buffer. */
static int buf_put(char **buf, size_t *len, size_t *cap, char c)
{
    if (*len + 1 >= *cap) {
        size_t ncap = *cap ? *cap * 2 : 32;
        char *nb = realloc(*buf, ncap);
        if (!nb)
            return -1;
        *buf = nb;
        *cap = ncap;
    }
    (*buf)[(*len)++] = c;
    return 0;
}

static int hex4(parser *ps, unsigned *out)
{
    unsigned v = 0;
    int i;
    if (ps->end - ps->p < 4)
        return fail(ps, "truncated \\u escape");
    for (i = 0; i < 4; i++) {
        char c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return fail(ps, "bad \\u escape");
    }
    ps->p += 4;
    *out = v;
    return 0;
}

static int put_utf8(char **buf, size_t *len, size_t *cap, unsigned cp)
{
    if (cp < 0x80)
        return buf_put(buf, len, cap, (char)cp);
    if (cp < 0x800)
        return buf_put(buf, len, cap, (char)(0xc0 | (cp >> 6))) ||
               buf_put(buf, len, cap, (char)(0x80 | (cp & 0x3f)));
    if (cp < 0x10000)
        return buf_put(buf, len, cap, (char)(0xe0 | (cp >> 12))) ||
               buf_put(buf, len, cap, (char)(0x80 | ((cp >> 6) & 0x3f))) ||
               buf_put(buf, len, cap, (char)(0x80 | (cp & 0x3f)));
    return buf_put(buf, len, cap, (char)(0xf0 | (cp >> 18))) ||
           buf_put(buf, len, cap, (char)(0x80 | ((cp >> 12) & 0x3f))) ||
           buf_put(buf, len, cap, (char)(0x80 | ((cp >> 6) & 0x3f))) ||
           buf_put(buf, len, cap, (char)(0x80 | (cp & 0x3f)));
}

/* Parses a string after its opening quote. */
static int parse_string(parser *ps, char **out, size_t *out_len)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        unsigned char c;
        if (ps->p >= ps->end) {
            free(buf);
            return fail(ps, "unterminated string");
        }
        c = (unsigned char)*ps->p++;
        if (c == '"')
            break;
        if (c < 0x20) {
            free(buf);
            return fail(ps, "control character in a string");
        }
        if (c != '\\') {
            if (buf_put(&buf, &len, &cap, (char)c))
                goto oom;
            continue;
        }
        if (ps->p >= ps->end) {
            free(buf);
            return fail(ps, "unterminated string");
        }
        c = (unsigned char)*ps->p++;
        switch (c) {
        case '"': case '\\': case '/':
            if (buf_put(&buf, &len, &cap, (char)c))
                goto oom;
            break;
        case 'b': if (buf_put(&buf, &len, &cap, '\b')) goto oom; break;
        case 'f': if (buf_put(&buf, &len, &cap, '\f')) goto oom; break;
        case 'n': if (buf_put(&buf, &len, &cap, '\n')) goto oom; break;
        case 'r': if (buf_put(&buf, &len, &cap, '\r')) goto oom; break;
        case 't': if (buf_put(&buf, &len, &cap, '\t')) goto oom; break;
        case 'u': {
            unsigned cp, lo;
            if (hex4(ps, &cp)) {
                free(buf);
                return -1;
            }
            if (cp >= 0xd800 && cp < 0xdc00) {
                if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    free(buf);
                    return fail(ps, "unpaired surrogate in \\u escape");
                }
                ps->p += 2;
                if (hex4(ps, &lo)) {
                    free(buf);
                    return -1;
                }
                if (lo < 0xdc00 || lo >= 0xe000) {
                    free(buf);
                    return fail(ps, "unpaired surrogate in \\u escape");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                free(buf);
                return fail(ps, "unpaired surrogate in \\u escape");
            }
            if (put_utf8(&buf, &len, &cap, cp))
                goto oom;
            break;
        }
        default:
            free(buf);
            return fail(ps, "bad escape '\\%c'", c);
        }
    }
    if (buf_put(&buf, &len, &cap, '\0'))
        goto oom;
    *out = buf;
    *out_len = len - 1;
    return 0;
oom:
    free(buf);
    return fail(ps, "out of memory");
}

static int parse_number(parser *ps, ardb_json *v)
{
    const char *s = ps->p;
    char tmp[64];
    size_t n;
    int integral = 1;
    char *endp;
    if (ps->p < ps->end && *ps->p == '-')
        ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return fail(ps, "bad number");
    if (*ps->p == '0')
        ps->p++;
    else
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    if (ps->p < ps->end && *ps->p == '.') {
        integral = 0;
        ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return fail(ps, "bad number");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        integral = 0;
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return fail(ps, "bad number");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    n = (size_t)(ps->p - s);
    if (n >= sizeof tmp)
        return fail(ps, "number too long");
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    v->type = ARDB_JSON_NUMBER;
    v->number = strtod(tmp, NULL);
    if (integral) {
        long long ll;
        errno = 0;
        ll = strtoll(tmp, &endp, 10);
        if (errno == 0 && *endp == '\0') {
            v->integer = ll;
            v->is_integer = 1;
        }
    }
    return 0;
}

static int expect_word(parser *ps, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0)
        return fail(ps, "unexpected character '%c'", *ps->p);
    ps->p += n;
    return 0;
}

/* Takes the character c if it comes next; whether it did. */
static int take(parser *ps, char c)
{
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return 1;
    }
    return 0;
}

/* What follows an element or a member: 1 for ',' (another comes), 0 for
 * the container's `close`, else -1 with the failure `expected`. */
static int next_item(parser *ps, char close, const char *expected)
{
    skip_space(ps);
    if (take(ps, ','))
        return 1;
    if (take(ps, close))
        return 0;
    return fail(ps, "%s", expected);
}

/* Appends a zeroed item to the array or object v (with room for its key
 * where with_key), doubling the capacity *cap when it is full. The new
 * item's index, or -1 when out of memory. */
static long add_item(ardb_json *v, size_t *cap, int with_key)
{
    if (v->count == *cap) {
        const size_t ncap = *cap ? *cap * 2 : 8;
        ardb_json *ni = realloc(v->items, ncap * sizeof *ni);
        if (!ni)
            return -1;
        v->items = ni;
        if (with_key) {
            char **nk = realloc(v->keys, ncap * sizeof *nk);
            if (!nk)
                return -1;
            v->keys = nk;
        }
        *cap = ncap;
    }
    memset(&v->items[v->count], 0, sizeof *v->items);
    return (long)v->count++;
}

/* An array's items or an object's members, after the opening bracket:
 * one comma-separated list, whose members are a name, a colon and a
 * value. */
static int parse_items(parser *ps, ardb_json *v, int depth, int object)
{
    const char close = object ? '}' : ']';
    size_t cap = 0;
    v->type = object ? ARDB_JSON_OBJECT : ARDB_JSON_ARRAY;
    skip_space(ps);
    if (take(ps, close))
        return 0;
    for (;;) {
        char *key = NULL;
        size_t klen;
        if (object) {
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != '"')
                return fail(ps, "expected a member name");
            ps->p++;
            if (parse_string(ps, &key, &klen))
                return -1;
        }
        const long i = add_item(v, &cap, object);
        if (i < 0) {
            free(key);
            return fail(ps, "out of memory");
        }
        if (object) {
            v->keys[i] = key;
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return fail(ps, "expected ':' after member name");
            ps->p++;
        }
        if (parse_value(ps, &v->items[i], depth + 1))
            return -1;
        const int more =
            next_item(ps, close, object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
        if (more <= 0)
            return more;
    }
}

static int parse_value(parser *ps, ardb_json *v, int depth)
{
    if (depth > JSON_MAX_DEPTH)
        return fail(ps, "nested deeper than %d", JSON_MAX_DEPTH);
    skip_space(ps);
    v->line = ps->line;
    if (ps->p >= ps->end)
        return fail(ps, "unexpected end of input");
    switch (*ps->p) {
    case '{':
        ps->p++;
        return parse_items(ps, v, depth, 1);
    case '[':
        ps->p++;
        return parse_items(ps, v, depth, 0);
    case '"':
        ps->p++;
        v->type = ARDB_JSON_STRING;
        return parse_string(ps, &v->string, &v->length);
    case 't':
        v->type = ARDB_JSON_BOOL;
        v->boolean = 1;
        return expect_word(ps, "true");
    case 'f':
        v->type = ARDB_JSON_BOOL;
        return expect_word(ps, "false");
    case 'n':
        v->type = ARDB_JSON_NULL;
        return expect_word(ps, "null");
    default:
        return parse_number(ps, v);
    }
}

int ardb__json_parse(const char *text, size_t len, ardb_json **out, char *err,
                     size_t err_len)
{
    parser ps = {text, text + len, 1, err, err_len, 0};
    ardb_json *v = calloc(1, sizeof *v);
    *out = NULL;
    if (!v) {
        if (err && err_len)
            snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (!text || parse_value(&ps, v, 0)) {
        if (!text)
            fail(&ps, "no input");
        ardb__json_free(v);
        return -1;
    }
    skip_space(&ps);
    if (ps.p != ps.end) {
        fail(&ps, "unexpected text after the value");
        ardb__json_free(v);
        return -1;
    }
    *out = v;
    return 0;
}

const ardb_json *ardb__json_get(const ardb_json *obj, const char *key)
{
    size_t i;
    if (!obj || obj->type != ARDB_JSON_OBJECT)
        return NULL;
    for (i = 0; i < obj->count; i++)
        if (!strcmp(obj->keys[i], key))
            return &obj->items[i];
    return NULL;
}

/* The character at s[0, n) (n >= 1): its length when it is well-formed
 * UTF-8 (Unicode 15, table 3-7: no overlong forms, no surrogates, nothing
 * above U+10FFFF), else 0 with *skip set to the length of its maximal
 * ill-formed prefix (at least 1), the unit that Unicode's "substitution of
 * maximal subparts" replaces with one U+FFFD. */
static size_t utf8_char(const unsigned char *s, size_t n, size_t *skip)
{
    unsigned c = s[0], lo = 0x80, hi = 0xbf;
    size_t k, j;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        k = 1;
    else if (c >= 0xe0 && c <= 0xef)
        k = 2;
    else if (c >= 0xf0 && c <= 0xf4)
        k = 3;
    else {
        *skip = 1;
        return 0;
    }
    if (c == 0xe0)
        lo = 0xa0; /* overlong below U+0800 */
    else if (c == 0xed)
        hi = 0x9f; /* surrogates U+D800..U+DFFF */
    else if (c == 0xf0)
        lo = 0x90; /* overlong below U+10000 */
    else if (c == 0xf4)
        hi = 0x8f; /* above U+10FFFF */
    for (j = 1; j <= k; j++) {
        if (j >= n || s[j] < lo || s[j] > hi) {
            *skip = j;
            return 0;
        }
        lo = 0x80;
        hi = 0xbf;
    }
    return k + 1;
}

int ardb__utf8_valid(const char *s, size_t n, size_t *bad_at)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, skip = 0, k;
    while (i < n) {
        if (!(k = utf8_char(u + i, n - i, &skip))) {
            if (bad_at)
                *bad_at = i;
            return 0;
        }
        i += k;
    }
    return 1;
}

int ardb__json_write_string(ardb_json_out fn, void *ctx, const char *s,
                            size_t n)
{
    char buf[512];
    size_t len = 0, i;
    int rc;
    buf[len++] = '"';
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (len + 8 > sizeof buf) {
            if ((rc = fn(ctx, buf, len)))
                return rc;
            len = 0;
        }
        switch (c) {
        case '"': buf[len++] = '\\'; buf[len++] = '"'; break;
        case '\\': buf[len++] = '\\'; buf[len++] = '\\'; break;
        case '\n': buf[len++] = '\\'; buf[len++] = 'n'; break;
        case '\r': buf[len++] = '\\'; buf[len++] = 'r'; break;
        case '\t': buf[len++] = '\\'; buf[len++] = 't'; break;
        default:
            if (c < 0x20) {
                len += (size_t)snprintf(buf + len, sizeof buf - len, "\\u%04x", c);
            } else if (c < 0x80) {
                buf[len++] = (char)c;
            } else {
                /* JSON text is UTF-8 (RFC 8259 §8.1), so bytes that are
                 * not, which a database can hold (SQLite does not check
                 * text), are written as U+FFFD rather than making the
                 * whole output unreadable to a strict parser. */
                size_t skip = 1, k = utf8_char((const unsigned char *)s + i, n - i, &skip);
                if (k) {
                    memcpy(buf + len, s + i, k);
                    len += k;
                    i += k - 1;
                } else {
                    memcpy(buf + len, "\\ufffd", 6);
                    len += 6;
                    i += skip - 1;
                }
            }
        }
    }
    buf[len++] = '"';
    return fn(ctx, buf, len);
}
