/* sha256.h - SHA-256 for content-addressed keys (source hashes, build keys). */
#ifndef AR_SHA256_H
#define AR_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct ar_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t fill;
} ar_sha256;

void ar_sha256_init(ar_sha256 *s);
void ar_sha256_update(ar_sha256 *s, const void *data, size_t len);
/* Writes 64 lowercase hex digits and a NUL to hex[65]. */
void ar_sha256_hex(ar_sha256 *s, char hex[65]);
/* One-shot hash of a NUL-terminated string. */
void ar_sha256_string(const char *text, char hex[65]);

#endif
