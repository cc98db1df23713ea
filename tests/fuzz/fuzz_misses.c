/*
 * fuzz_misses.c - the miss-file reader of `attnres tune --from-misses`
 * (runtime/src/miss_file.c, which also writes the file).
 *
 * Invariants: a refusal has a message naming the file and the line ("PATH:
 * LINE: ...") and leaves nothing; every accepted miss passes the runtime's
 * own attnres_problem_check, has a power-of-two T bucket in range and a
 * printable device fingerprint, appears once, and formats back into a line
 * that parses to the same miss.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "fuzz.h"
#include "attnres-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024], err[512];
    fuzz_write_file("misses.txt", data, size, path, sizeof path);
    ar_miss *m = NULL;
    size_t n = 0;
    int torn = 0;
    err[0] = '\0';
    if (ar_miss_read_file(path, &m, &n, &torn, err, sizeof err) != 0) {
        fuzz_verdict = FUZZ_REFUSED;
        if (!err[0])
            fuzz_fail("refusal without a message", NULL);
        size_t plen = strlen(path);
        if (strncmp(err, path, plen) != 0 || err[plen] != ':')
            fuzz_fail("refusal does not name the file", err);
        if (m || n || torn)
            fuzz_fail("refusal leaves misses behind", err);
        return 0;
    }
    fuzz_verdict = FUZZ_ACCEPTED;
    if (n && !m)
        fuzz_fail("accepted misses without items", NULL);
    if (!torn && size && data[size - 1] != '\n')
        fuzz_fail("a last line without its newline was not counted as cut short", NULL);
    for (size_t i = 0; i < n; i++) {
        char msg[256], line[AR_MISS_LINE_MAX + 1];
        if (attnres_problem_check(&m[i].p, msg, sizeof msg) != ATTNRES_OK)
            fuzz_fail("accepted a problem the runtime refuses", msg);
        if (m[i].t < 1 || m[i].t > AR_MISS_MAX_T || (m[i].t & (m[i].t - 1)) != 0)
            fuzz_fail("accepted a T bucket that is not a power of two in range", NULL);
        for (const char *c = m[i].device; *c; c++)
            if (*c < 0x20 || *c >= 0x7f)
                fuzz_fail("accepted a device fingerprint with a control byte", m[i].device);
        int len = ar_miss_format_line(&m[i], line, sizeof line);
        if (len < 1 || line[len - 1] != '\n')
            fuzz_fail("an accepted miss does not format back into a line", m[i].device);
        ar_miss back;
        if (ar_miss_parse_line(line, (size_t)len - 1, &back, msg, sizeof msg) != 0)
            fuzz_fail("a formatted line does not parse", msg);
        if (back.t != m[i].t || back.p.d != m[i].p.d || back.p.n != m[i].p.n || back.p.op != m[i].p.op ||
            strcmp(back.device, m[i].device) != 0)
            fuzz_fail("a miss changes on its way through its line", line);
        for (size_t j = 0; j < i; j++)
            if (m[j].t == m[i].t && memcmp(&m[j].p, &m[i].p, sizeof m[i].p) == 0 &&
                strcmp(m[j].device, m[i].device) == 0)
                fuzz_fail("a miss is listed twice", line);
    }
    free(m);
    return 0;
}
