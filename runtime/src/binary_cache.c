/* binary_cache.c - see binary_cache.h. */
#include "binary_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* mkdir -p for the cache directory. */
static int make_dirs(const char *dir)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
    return access(buf, W_OK | X_OK) == 0 ? 0 : -1;
}

int ar_cache_path(const char *key, const char *ext, char *path, size_t len)
{
    char dir[3500];
    const char *env = getenv("ATTNRES_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (env && *env)
        snprintf(dir, sizeof dir, "%s", env);
    else if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/attnres", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/attnres", home);
    else
        snprintf(dir, sizeof dir, "/tmp/attnres-cache-%ld", (long)getuid());
    if (make_dirs(dir) != 0) {
        snprintf(dir, sizeof dir, "/tmp/attnres-cache-%ld", (long)getuid());
        if (make_dirs(dir) != 0)
            return -1;
    }
    int n = snprintf(path, len, "%s/%s%s", dir, key, ext);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

/* Whether the file at path holds exactly these bytes. */
static int same_content(const char *path, const void *blob, size_t size)
{
    struct stat st;
    if (stat(path, &st) != 0 || (size_t)st.st_size != size)
        return 0;
    void *have = NULL;
    size_t have_size = 0;
    int same = ar_read_file(path, &have, &have_size) == 0 && have_size == size && memcmp(have, blob, size) == 0;
    free(have);
    return same;
}

int ar_cache_store(const char *path, const void *blob, size_t size)
{
    if (same_content(path, blob, size))
        return 0;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    const char *p = blob;
    size_t left = size;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

int ar_read_file(const char *path, void **blob, size_t *size)
{
    *blob = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return -1;
    }
    long n = ftell(f);
    rewind(f);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    buf[n] = 0;
    *blob = buf;
    *size = (size_t)n;
    return 0;
}

void ar_cache_drop(const char *path) { unlink(path); }

/* ---- XXH64 ------------------------------------------------------------ */

#define XXH_P1 0x9E3779B185EBCA87ull
#define XXH_P2 0xC2B2AE3D27D4EB4Full
#define XXH_P3 0x165667B19E3779F9ull
#define XXH_P4 0x85EBCA77C2B2AE63ull
#define XXH_P5 0x27D4EB2F165667C5ull

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t read64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only, as every target of attnres */
}
static uint32_t read32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t xxh_round(uint64_t acc, uint64_t input) { return rotl64(acc + input * XXH_P2, 31) * XXH_P1; }
static uint64_t xxh_merge(uint64_t acc, uint64_t v) { return (acc ^ xxh_round(0, v)) * XXH_P1 + XXH_P4; }

uint64_t ar_xxh64(const void *data, size_t len)
{
    const unsigned char *p = data, *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = XXH_P1 + XXH_P2, v2 = XXH_P2, v3 = 0, v4 = 0 - XXH_P1;
        for (; p + 32 <= end; p += 32) {
            v1 = xxh_round(v1, read64(p));
            v2 = xxh_round(v2, read64(p + 8));
            v3 = xxh_round(v3, read64(p + 16));
            v4 = xxh_round(v4, read64(p + 24));
        }
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh_merge(xxh_merge(xxh_merge(xxh_merge(h, v1), v2), v3), v4);
    } else {
        h = XXH_P5;
    }
    h += (uint64_t)len;
    for (; p + 8 <= end; p += 8)
        h = rotl64(h ^ xxh_round(0, read64(p)), 27) * XXH_P1 + XXH_P4;
    if (p + 4 <= end) {
        h = rotl64(h ^ (uint64_t)read32(p) * XXH_P1, 23) * XXH_P2 + XXH_P3;
        p += 4;
    }
    for (; p < end; p++)
        h = rotl64(h ^ *p * XXH_P5, 11) * XXH_P1;
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    return h;
}

/* ---- seals ------------------------------------------------------------ */

static const char seal_tag[] = "\nattnres-xxh64 "; /* 15 characters */

static void seal_text(const void *data, size_t len, char hex[17])
{
    snprintf(hex, 17, "%016llx", (unsigned long long)ar_xxh64(data, len));
}

int ar_blob_seal(void **blob, size_t *size)
{
    char *b = realloc(*blob, *size + AR_BLOB_SEAL_LEN + 1);
    if (!b)
        return -1;
    char hex[17];
    seal_text(b, *size, hex);
    memcpy(b + *size, seal_tag, 15);
    memcpy(b + *size + 15, hex, 16);
    b[*size + 15 + 16] = '\n';
    b[*size + AR_BLOB_SEAL_LEN] = 0;
    *blob = b;
    *size += AR_BLOB_SEAL_LEN;
    return 0;
}

int ar_blob_check(const void *blob, size_t size)
{
    const char *b = blob;
    if (!b || size < AR_BLOB_SEAL_LEN)
        return -1;
    const size_t body = size - AR_BLOB_SEAL_LEN;
    if (memcmp(b + body, seal_tag, 15) != 0 || b[size - 1] != '\n')
        return -1;
    char hex[17];
    seal_text(b, body, hex);
    return memcmp(hex, b + body + 15, 16) == 0 ? 0 : -2;
}
