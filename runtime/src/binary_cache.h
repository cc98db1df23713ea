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

/* Writes the cache path of key+ext ("/.../<key>.so") to path. Creates the
 * directory. Returns 0, or -1 when no cache directory is usable. */
int ar_cache_path(const char *key, const char *ext, char *path, size_t len);

/* Stores blob under path unless an entry of the same size is there. */
int ar_cache_store(const char *path, const void *blob, size_t size);

/* Reads a whole file into a malloc'ed buffer; -1 if absent or unreadable. */
int ar_read_file(const char *path, void **blob, size_t *size);

#endif
