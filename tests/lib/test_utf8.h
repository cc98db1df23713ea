/*
 * test_utf8.h - whether bytes are well-formed UTF-8, for the tests that
 * check what the library writes (db exports, the db fuzz target). It
 * decodes each sequence and refuses overlong forms, surrogates and code
 * points past U+10FFFF, which is Unicode's table 3-7 said another way: it
 * is written apart from db/'s own check so that the tests do not trust the
 * code they test. Header-only.
 */
#ifndef ATTNRES_TEST_UTF8_H
#define ATTNRES_TEST_UTF8_H

#include <stddef.h>

/* Whether s[0, n) is well-formed UTF-8. */
static inline int utf8_valid(const void *s, size_t n)
{
    const unsigned char *u = s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t len;
        unsigned cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (i + len > n)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((u[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

#endif
