/*
 * atomic_file.h - a user's output file written whole or not at all, the one
 * way every command writes one (db export, db plot, run's .npy outputs).
 *
 * The data go to a hidden temporary beside the target (DIR/.NAME.tmp-XXXXXX:
 * the same directory, so the rename cannot cross file systems), which is
 * flushed and synced to disk, renamed over the target, and made durable by
 * a sync of the directory. Until the rename, and after any failure before
 * it, the target holds what it held before (or stays absent). A new file
 * gets the permissions fopen would give it; a replaced one keeps its own.
 *
 * Every function that can fail returns 0 or -1 with the reason in err (at
 * most len bytes, naming the target, never the temporary).
 */
#ifndef CLI_ATOMIC_FILE_H
#define CLI_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct atomic_file {
    char *path;  /* the target */
    char *tmp;   /* the temporary, NULL once renamed or removed */
    FILE *f;     /* open while writing */
    int mode;    /* the target's permissions, or 0666 & ~umask for a new one */
    int renamed; /* the temporary has replaced the target */
} atomic_file;

/* Creates the temporary for path, open for writing at o->f. Refuses a path
 * that names a directory or anything else but a regular file. */
int atomic_file_open(atomic_file *o, const char *path, char *err, size_t len);

/* Flushes, syncs and closes the temporary after writing; on failure the
 * temporary is removed. */
int atomic_file_close(atomic_file *o, char *err, size_t len);

/* Renames a closed temporary over its target, then syncs the directory.
 * When the rename fails the temporary is removed and the target is
 * untouched; when only the directory's sync fails, o->renamed is set: the
 * new file is in place but may not survive a crash. */
int atomic_file_commit(atomic_file *o, char *err, size_t len);

/* Removes the temporary (open or closed) and frees o's strings; safe after
 * commit, on a zeroed struct, and twice. */
void atomic_file_discard(atomic_file *o);

#endif
