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

int ar_cache_store(const char *path, const void *blob, size_t size)
{
    struct stat st;
    if (stat(path, &st) == 0 && (size_t)st.st_size == size)
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
