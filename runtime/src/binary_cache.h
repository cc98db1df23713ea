/*
 * binary_cache.h - compiled kernels on disk, content-addressed by build key.
 *
 * The directory is $ATTNRES_CACHE_DIR, else $XDG_CACHE_HOME/attnres, else
 * $HOME/.cache/attnres, else /tmp/attnres-cache-<uid>. A file is named by
 * its build key, so an entry never goes stale: a different source, compiler,
 * option or target is a different key. Files are written to a temporary
 * name and renamed, so a reader never sees half a binary.
 */
#ifndef AR_BINARY_CACHE_H
#define AR_BINARY_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* Writes the cache path of key+ext ("/.../<key>.so") to path. Creates the
 * directory. Returns 0, or -1 when no cache directory is usable. */
int ar_cache_path(const char *key, const char *ext, char *path, size_t len);

/* Stores blob under path unless an entry with the same bytes is there; a
 * different (say, damaged) entry is replaced atomically. */
int ar_cache_store(const char *path, const void *blob, size_t size);

/* Removes a cache entry that failed to load, so that the next store
 * replaces it. Best effort. */
void ar_cache_drop(const char *path);

/* Integrity of compiled binaries. The backend seals what its compiler
 * writes by appending a trailer, "\nattnres-xxh64 " and the 16 hex digits
 * of the XXH64 checksum of the bytes before it, and checks the seal before
 * it loads a binary from the cache or the database: bytes damaged anywhere
 * (which SQLite cannot see inside a blob) are refused instead of reaching
 * dlopen or a launch. The trailer is invisible to the loader (it lies past
 * everything the ELF headers describe). XXH64 detects damage, not malice
 * (a hostile database could as well hold a hostile source), and costs about
 * a microsecond for a kernel. */
#define AR_BLOB_SEAL_LEN (15 + 16 + 1)

/* Appends the seal to a malloc'ed blob (realloc'ed). 0, or -1 when out of
 * memory (the blob is then unchanged). */
int ar_blob_seal(void **blob, size_t *size);

/* 0 when blob carries a seal that matches its bytes; -1 when it carries
 * none (compiled by an older attnres, or cut short); -2 when the seal does
 * not match (damaged). */
int ar_blob_check(const void *blob, size_t size);

/* XXH64 (the 64-bit hash of xxHash) of data, seed 0. */
uint64_t ar_xxh64(const void *data, size_t len);

/* Reads a whole file into a malloc'ed buffer; -1 if absent or unreadable. */
int ar_read_file(const char *path, void **blob, size_t *size);

#endif
