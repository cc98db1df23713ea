/* atomic_file.c - see atomic_file.h. */
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int atomic_file_open(atomic_file *o, const char *path, char *err, size_t len)
{
    const char *slash = strrchr(path, '/');
    const size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    struct stat sb;
    memset(o, 0, sizeof *o);
    if (!*path || (slash && !slash[1])) {
        snprintf(err, len, "cannot write '%s': not a file name", path);
        return -1;
    }
    if (stat(path, &sb) == 0) {
        if (!S_ISREG(sb.st_mode)) {
            snprintf(err, len, "cannot write %s: not a regular file", path);
            return -1;
        }
        o->mode = (int)(sb.st_mode & 07777);
    } else {
        /* A new file gets what fopen would give it. The umask can only be
         * read by setting it; the command line is single-threaded here. */
        const mode_t mask = umask(022);
        umask(mask);
        o->mode = (int)(0666 & ~mask);
    }
    /* DIR/.NAME.tmp-XXXXXX: hidden, and beside the target so that the
     * rename replaces it in one step. */
    const size_t n = strlen(path) + 16;
    o->path = strdup(path);
    o->tmp = malloc(n);
    if (!o->path || !o->tmp) {
        snprintf(err, len, "cannot write %s: out of memory", path);
        atomic_file_discard(o);
        return -1;
    }
    snprintf(o->tmp, n, "%.*s.%s.tmp-XXXXXX", (int)dir_len, path, path + dir_len);
    const int fd = mkstemp(o->tmp);
    if (fd < 0) {
        snprintf(err, len, "cannot write %s: %s", path, strerror(errno));
        free(o->tmp);
        o->tmp = NULL;
        atomic_file_discard(o);
        return -1;
    }
    if (fchmod(fd, (mode_t)o->mode) != 0 || !(o->f = fdopen(fd, "wb"))) {
        snprintf(err, len, "cannot write %s: %s", path, strerror(errno));
        close(fd);
        atomic_file_discard(o);
        return -1;
    }
    return 0;
}

int atomic_file_close(atomic_file *o, char *err, size_t len)
{
    int failed = 0, why = 0;
    if (!o->f) {
        if (o->tmp)
            return 0;
        snprintf(err, len, "cannot write %s: no temporary is open", o->path ? o->path : "a file");
        return -1;
    }
    /* Synced before the rename, so that a crash after it cannot leave an
     * empty or partial file under the target's name. */
    if (fflush(o->f) != 0 || ferror(o->f) || fsync(fileno(o->f)) != 0) {
        failed = 1;
        why = errno;
    }
    if (fclose(o->f) != 0 && !failed) {
        failed = 1;
        why = errno;
    }
    o->f = NULL;
    if (failed) {
        snprintf(err, len, "writing %s failed: %s", o->path, why ? strerror(why) : "write error");
        remove(o->tmp);
        free(o->tmp);
        o->tmp = NULL;
        return -1;
    }
    return 0;
}

/* Syncs the directory that holds path, so that a rename into it survives
 * a crash. A file system that cannot sync a directory (EINVAL) has
 * nothing more to make durable. */
static int sync_directory(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[4200];
    if (!slash)
        strcpy(dir, ".");
    else if (slash == path)
        strcpy(dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else {
        errno = ENAMETOOLONG;
        return -1;
    }
    const int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    if (rc != 0 && (errno == EINVAL || errno == ENOTSUP))
        rc = 0;
    const int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

int atomic_file_commit(atomic_file *o, char *err, size_t len)
{
    if (!o->tmp || o->f) {
        snprintf(err, len, "cannot write %s: the temporary is not closed", o->path ? o->path : "a file");
        return -1;
    }
    if (rename(o->tmp, o->path) != 0) {
        snprintf(err, len, "cannot write %s: %s", o->path, strerror(errno));
        remove(o->tmp);
        free(o->tmp);
        o->tmp = NULL;
        return -1;
    }
    free(o->tmp);
    o->tmp = NULL;
    o->renamed = 1;
    if (sync_directory(o->path) != 0) {
        snprintf(err, len, "%s was written, but its directory could not be synced: %s", o->path,
                 strerror(errno));
        return -1;
    }
    return 0;
}

void atomic_file_discard(atomic_file *o)
{
    if (o->f)
        fclose(o->f);
    o->f = NULL;
    if (o->tmp)
        remove(o->tmp);
    free(o->tmp);
    free(o->path);
    o->tmp = o->path = NULL;
}
