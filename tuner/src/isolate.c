/* isolate.c - see isolate.h. */
#define _GNU_SOURCE
#include "isolate.h"
#include "tuner_base.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* fmt has one %s for detail, which is cut to fit the message. */
static void set_message(job_result *r, const char *fmt, const char *detail)
{
    char cut[400];
    snprintf(cut, sizeof cut, "%.399s", detail);
    snprintf(r->message, sizeof r->message, fmt, cut);
}

static void result_clear(job_result *r)
{
    memset(r, 0, sizeof *r);
    r->rel_err = NAN;
    r->paired = r->paired_spread = r->pair_gbps = NAN;
    r->dist.wait_frac = r->dist.steal_frac = r->dist.preempted_per_s = NAN;
    r->dist.stream_gbps = r->dist.stream_usual_gbps = NAN;
}

/* Loads a candidate on dev; on failure fills r. */
static int load(attnres_device *dev, const job_kernel *k, ar_kernel *out, job_result *r)
{
    memset(out, 0, sizeof *out);
    snprintf(out->build_key, sizeof out->build_key, "%s", k->build_key);
    snprintf(out->variant, sizeof out->variant, "%s", k->variant);
    int rc = dev->ops->load(dev, k->blob, k->blob_size, k->source, k->kernel_name, k->params_json, out);
    if (rc != ATTNRES_OK) {
        r->status = ARDB_STATUS_LAUNCH_FAILED;
        set_message(r, "load failed: %s", attnres_device_errmsg(dev));
    }
    return rc;
}

/* ---- cutting a screening launch short, in a measuring child --------- */

/* When the deadline passes, SIGALRM's handler (in whichever thread takes
 * it) sends the result prepared here and ends the process; the kernel's
 * threads end with it. Whoever first moves cut_state from CUT_ARMED owns
 * the candidate's result: the handler (to CUT_FIRED), or cut_disarm once
 * the launches ended in time (to CUT_IDLE), so exactly one result is
 * sent. */
enum { CUT_IDLE, CUT_ARMED, CUT_FIRED };
static volatile sig_atomic_t cut_state;
static int cut_fd = -1;
static job_result cut_result;
static struct timespec cut_started;

static void cut_now(int sig)
{
    (void)sig;
    sig_atomic_t armed = CUT_ARMED;
    if (!__atomic_compare_exchange_n(&cut_state, &armed, CUT_FIRED, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    cut_result.time_s =
        (double)(now.tv_sec - cut_started.tv_sec) + (double)(now.tv_nsec - cut_started.tv_nsec) * 1e-9;
    const char *p = (const char *)&cut_result;
    size_t n = sizeof cut_result;
    while (n) {
        ssize_t w = write(cut_fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        n -= (size_t)w;
    }
    _exit(0);
}

/* Arms the deadline: after_us from now, r (so far) goes to fd as cut. */
static int cut_arm(int fd, const job_result *r, double after_us)
{
    cut_result = *r;
    cut_result.status = ARDB_STATUS_SKIPPED;
    cut_result.tm.stopped = 1;
    cut_result.cut = 1;
    snprintf(cut_result.message, sizeof cut_result.message,
             "stopped during a launch, still running at its deadline of %.1f ms from the fastest so far",
             after_us / 1e3);
    cut_fd = fd;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = cut_now;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, NULL) != 0)
        return -1;
    clock_gettime(CLOCK_MONOTONIC, &cut_started);
    struct itimerval it;
    memset(&it, 0, sizeof it);
    it.it_value.tv_sec = (time_t)(after_us / 1e6);
    it.it_value.tv_usec = (suseconds_t)fmod(after_us, 1e6);
    if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0)
        it.it_value.tv_usec = 1;
    cut_state = CUT_ARMED;
    if (setitimer(ITIMER_REAL, &it, NULL) != 0) {
        cut_state = CUT_IDLE;
        return -1;
    }
    return 0;
}

/* Disarms the deadline once the launches it covers ended (a second call
 * does nothing); if the handler has claimed the result, it is sending it
 * and ending the process, so this waits for that. */
static void cut_disarm(void)
{
    sig_atomic_t armed = CUT_ARMED;
    if (__atomic_compare_exchange_n(&cut_state, &armed, CUT_IDLE, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        struct itimerval off;
        memset(&off, 0, sizeof off);
        setitimer(ITIMER_REAL, &off, NULL);
        return;
    }
    while (armed == CUT_FIRED)
        pause();
}

/* The deadline of one measurement in a child: its pipe and microseconds
 * (0: none). */
typedef struct cut_plan {
    int fd;
    double after_us;
} cut_plan;

static void measure_here(attnres_device *dev, bench_case *bc, const job_kernel *k, const job_options *opt,
                         const cut_plan *cut, job_result *r)
{
    result_clear(r);
    ar_kernel kern;
    if (load(dev, k, &kern, r) != ATTNRES_OK)
        return;
    if (opt->verify) {
        double t0 = artuner_now_s();
        int rc = bench_case_verify(bc, &kern, &r->rel_err);
        r->verify_s = artuner_now_s() - t0;
        if (rc != ATTNRES_OK) {
            r->status = ARDB_STATUS_LAUNCH_FAILED;
            set_message(r, "launch failed: %s", attnres_device_errmsg(dev));
            goto done;
        }
        char why[512];
        const ardb_status verdict = bench_case_judge(bc, r->rel_err, why, sizeof why);
        if (verdict != ARDB_STATUS_OK) {
            r->status = verdict;
            set_message(r, "%s", why);
            goto done;
        }
    }
    if (opt->policy.max_reps > 0) {
        double t0 = artuner_now_s();
        /* The deadline covers the launches up to the stop decision. */
        measure_policy pol = opt->policy;
        int armed = cut && cut->after_us > 0 && cut_arm(cut->fd, r, cut->after_us) == 0;
        if (armed)
            pol.decided = cut_disarm;
        int rc = bench_case_time(bc, &kern, &pol, &r->tm);
        if (armed)
            cut_disarm();
        r->time_s = artuner_now_s() - t0;
        if (rc != ATTNRES_OK) {
            r->status = ARDB_STATUS_LAUNCH_FAILED;
            set_message(r, "timed launch failed: %s", attnres_device_errmsg(dev));
            goto done;
        }
    }
    r->status = ARDB_STATUS_OK;
done:
    dev->ops->unload(dev, &kern);
}

/* The pass's rate over each kernel's round by round: per kernel the median
 * ratio of its rate to the pass's, and its spread. */
static void pair_results(const bench_case *bc, const paired_stream *ps, const double *t, const double *ts,
                         const int *ok, size_t k, int rounds, job_result *out)
{
    double *ratio = malloc(sizeof(double) * (size_t)rounds);
    timing pass;
    if (!ratio)
        return;
    for (int r = 0; r < rounds; r++)
        ratio[r] = ps->bytes / (ts[r] * 1e3);
    timing_summarize(ratio, rounds, &pass);
    for (size_t i = 0; i < k; i++) {
        if (!ok[i])
            continue;
        for (int r = 0; r < rounds; r++)
            ratio[r] = bench_case_bytes(bc) * ts[r] / (ps->bytes * t[i * (size_t)rounds + (size_t)r]);
        timing tm;
        timing_summarize(ratio, rounds, &tm);
        out[i].paired = tm.median_us;
        out[i].paired_spread = tm.spread_us;
        out[i].pair_gbps = pass.median_us;
    }
    free(ratio);
}

/* The most launches in one candidate's share of a round. */
#define ROUND_BATCH_MAX 256

/* Launches per round that fill round_us, from one launch's microseconds. */
static int round_batch(double round_us, double one_us)
{
    if (!(round_us > 0) || !(one_us > 0) || one_us >= round_us)
        return 1;
    double n = ceil(round_us / one_us);
    return n < ROUND_BATCH_MAX ? (int)n : ROUND_BATCH_MAX;
}

static int cmp_us(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_us);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One factor per round, common to its candidates (isolate.h). */
void interleave_normalize(double *t, const int *ok, size_t k, int rounds)
{
    size_t n = 0;
    for (size_t i = 0; i < k; i++)
        n += ok[i] != 0;
    double *level = malloc(sizeof(double) * (size_t)rounds);
    double *col = malloc(sizeof(double) * (n ? n : 1));
    double *sorted = malloc(sizeof(double) * (size_t)rounds);
    if (n >= 2 && level && col && sorted) {
        for (int r = 0; r < rounds; r++) {
            size_t m = 0;
            for (size_t i = 0; i < k; i++)
                if (ok[i])
                    col[m++] = t[i * (size_t)rounds + (size_t)r];
            level[r] = m == 2 ? sqrt(col[0] * col[1]) : median_of(col, m);
        }
        memcpy(sorted, level, sizeof(double) * (size_t)rounds);
        double typical = median_of(sorted, (size_t)rounds);
        for (int r = 0; r < rounds; r++)
            for (size_t i = 0; level[r] > 0 && i < k; i++)
                if (ok[i])
                    t[i * (size_t)rounds + (size_t)r] *= typical / level[r];
    }
    free(level);
    free(col);
    free(sorted);
}

static void interleave_here(attnres_device *dev, bench_case *bc, const job_kernel *ks, size_t k, int rounds,
                            const job_options *opt, job_result *out)
{
    if (rounds < 1)
        rounds = 1;
    ar_kernel *kern = calloc(k, sizeof *kern);
    double *t = malloc(sizeof(double) * k * (size_t)rounds);
    double *ts = opt->pair ? malloc(sizeof(double) * (size_t)rounds) : NULL;
    int *ok = calloc(k, sizeof *ok);
    int *batch = calloc(k, sizeof *batch);
    double *launch = malloc(sizeof(double) * ROUND_BATCH_MAX);
    int paired = ts != NULL;
    for (size_t i = 0; i < k; i++) {
        result_clear(&out[i]);
        if (!kern || !t || !ok || !batch || !launch) {
            out[i].status = ARDB_STATUS_LAUNCH_FAILED;
            set_message(&out[i], "%s", "out of memory");
            continue;
        }
        ok[i] = load(dev, &ks[i], &kern[i], &out[i]) == ATTNRES_OK;
        batch[i] = 1;
    }
    if (kern && t && ok && batch && launch) {
        /* One warm-up launch each, which sizes the batches, then the
         * rounds: each candidate's figure in a round is the median of its
         * batch. */
        disturbance_mark mark;
        disturbance_begin(&mark);
        for (int r = -1; r < rounds; r++) {
            for (size_t i = 0; i < k; i++) {
                if (!ok[i])
                    continue;
                if (bench_case_time_launches(bc, &kern[i], batch[i], opt->policy.flush, launch) != ATTNRES_OK) {
                    ok[i] = 0;
                    out[i].status = ARDB_STATUS_LAUNCH_FAILED;
                    set_message(&out[i], "launch failed: %s", attnres_device_errmsg(dev));
                    continue;
                }
                if (r < 0)
                    batch[i] = round_batch(opt->round_us, launch[0]);
                else
                    t[i * (size_t)rounds + (size_t)r] = median_of(launch, (size_t)batch[i]);
            }
            /* A pass that fails leaves the kernels' timings as they are,
             * without a paired figure. */
            double us = 0;
            if (paired && paired_stream_run(dev, opt->pair, &us) != ATTNRES_OK)
                paired = 0;
            else if (paired && r >= 0)
                ts[r] = us;
        }
        const disturbance dist = disturbance_end(&mark);
        for (size_t i = 0; i < k; i++)
            out[i].dist = dist;
        if (paired)
            pair_results(bc, opt->pair, t, ts, ok, k, rounds, out);
        interleave_normalize(t, ok, k, rounds);
        for (size_t i = 0; i < k; i++)
            if (ok[i]) {
                timing_summarize(t + i * (size_t)rounds, rounds, &out[i].tm);
                out[i].status = ARDB_STATUS_OK;
            }
    }
    for (size_t i = 0; kern && ok && i < k; i++)
        if (kern[i].entry || kern[i].module)
            dev->ops->unload(dev, &kern[i]);
    free(kern);
    free(t);
    free(ts);
    free(ok);
    free(batch);
    free(launch);
}

/* ---- the forked child ------------------------------------------------- */

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* What a measuring child runs once it has its own CPU device: fd is the
 * pipe to the parent, for its results. */
typedef void (*child_body)(attnres_device *dev, bench_case *bc, const void *arg, int fd);

/* Forks a measuring child that opens its own CPU device, runs body and
 * exits. Returns its pid with the pipe's read end in *rfd, or -1 with the
 * reason in err. */
static pid_t fork_child(bench_case *bc, child_body body, const void *arg, int *rfd, char *err, size_t err_len)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(err, err_len, "cannot create a pipe: %s", strerror(errno));
        return -1;
    }
    fflush(NULL);
    /* The child must not outlive the tuner: a hanging kernel would spin on
     * a core for as long as the machine runs, with nobody left to kill it
     * at the time limit. The child asks for SIGKILL when its parent dies;
     * the parent may have died between fork and that request, in which
     * case the child has already been handed to another process and sees
     * a different parent pid than the one recorded here. */
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        snprintf(err, err_len, "cannot fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        /* PR_SET_PDEATHSIG fires when the thread that forked ends, not
         * only the process: the tuner measures from its main thread, which
         * lives as long as the process does. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(5);
        close(fds[0]);
        attnres_device *dev;
        char msg[256];
        if (attnres_device_open("cpu", &dev, msg, sizeof msg) != ATTNRES_OK)
            _exit(3);
        bench_case_set_device(bc, dev);
        body(dev, bc, arg, fds[1]);
        _exit(0);
    }
    close(fds[1]);
    *rfd = fds[0];
    return pid;
}

/* Reads want bytes from fd before the deadline (0: none). 0 when all came;
 * -1 at the end of the pipe, an error or the deadline (*timed_out then). */
static int read_by(int fd, void *buf, size_t want, double deadline, int *timed_out)
{
    size_t got = 0;
    *timed_out = 0;
    while (got < want) {
        int wait_ms = -1;
        if (deadline) {
            double left = deadline - artuner_now_s();
            if (left <= 0) {
                *timed_out = 1;
                return -1;
            }
            wait_ms = (int)(left * 1000) + 1;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int pr = poll(&pfd, 1, wait_ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0)
            continue;
        ssize_t r = read(fd, (char *)buf + got, want - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Ends a child: killed first when it timed out; its wait status. */
static int reap(pid_t pid, int fd, int kill_it)
{
    if (kill_it)
        kill(pid, SIGKILL);
    close(fd);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    return ws;
}

/* Why a child gave no result: the time limit, a signal or its exit. */
static void child_failed(job_result *r, int timed_out, int ws, double limit_s)
{
    if (timed_out) {
        r->status = ARDB_STATUS_TIMEOUT;
        snprintf(r->message, sizeof r->message, "killed after the %.0f s time limit", limit_s);
    } else if (WIFSIGNALED(ws)) {
        r->status = ARDB_STATUS_LAUNCH_FAILED;
        snprintf(r->message, sizeof r->message, "crashed with signal %d (%s)", WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    } else {
        r->status = ARDB_STATUS_LAUNCH_FAILED;
        snprintf(r->message, sizeof r->message, "measuring process exited with status %d",
                 WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    }
}

/* Runs fn in a child with its own CPU device and collects k results. */
typedef void (*child_fn)(attnres_device *dev, bench_case *bc, const void *arg, job_result *out);

typedef struct whole_arg {
    child_fn fn;
    const void *arg;
    size_t k;
} whole_arg;

static void child_whole(attnres_device *dev, bench_case *bc, const void *argp, int fd)
{
    const whole_arg *a = argp;
    job_result *res = calloc(a->k, sizeof *res);
    if (!res)
        _exit(3);
    a->fn(dev, bc, a->arg, res);
    if (write_all(fd, res, a->k * sizeof *res))
        _exit(4);
}

static void run_isolated(bench_case *bc, child_fn fn, const void *arg, size_t k, double limit_s, job_result *out)
{
    for (size_t i = 0; i < k; i++) {
        result_clear(&out[i]);
        out[i].status = ARDB_STATUS_LAUNCH_FAILED;
    }
    whole_arg wa = {fn, arg, k};
    int fd = -1;
    char err[256];
    pid_t pid = fork_child(bc, child_whole, &wa, &fd, err, sizeof err);
    if (pid < 0) {
        for (size_t i = 0; i < k; i++)
            set_message(&out[i], "%s", err);
        return;
    }
    size_t want = k * sizeof(job_result);
    job_result *tmp = malloc(want);
    int timed_out = 0;
    int got = tmp ? read_by(fd, tmp, want, limit_s > 0 ? artuner_now_s() + limit_s : 0, &timed_out) : -1;
    int ws = reap(pid, fd, timed_out);
    if (got == 0)
        memcpy(out, tmp, want);
    else
        for (size_t i = 0; i < k; i++)
            child_failed(&out[i], timed_out, ws, limit_s);
    free(tmp);
}

typedef struct measure_arg {
    const job_kernel *k;
    const job_options *opt;
} measure_arg;

static void child_measure(attnres_device *dev, bench_case *bc, const void *argp, job_result *out)
{
    const measure_arg *a = argp;
    measure_here(dev, bc, a->k, a->opt, NULL, out);
}

typedef struct interleave_arg {
    const job_kernel *ks;
    size_t k;
    int rounds;
    const job_options *opt;
} interleave_arg;

static void child_interleave(attnres_device *dev, bench_case *bc, const void *argp, job_result *out)
{
    const interleave_arg *a = argp;
    interleave_here(dev, bc, a->ks, a->k, a->rounds, a->opt, out);
}

void job_measure(attnres_device *dev, bench_case *bc, const job_kernel *k, const job_options *opt, job_result *out)
{
    if (opt->isolate && strcmp(dev->backend, "cpu") == 0) {
        measure_arg a = {k, opt};
        run_isolated(bc, child_measure, &a, 1, opt->time_limit_s, out);
    } else {
        measure_here(dev, bc, k, opt, NULL, out);
    }
}

void job_interleave(attnres_device *dev, bench_case *bc, const job_kernel *ks, size_t k, int rounds,
                    const job_options *opt, job_result *out)
{
    if (opt->isolate && strcmp(dev->backend, "cpu") == 0) {
        interleave_arg a = {ks, k, rounds, opt};
        /* The pass takes about as long as one more kernel. */
        run_isolated(bc, child_interleave, &a, k, opt->time_limit_s * (double)(k + (opt->pair != NULL)), out);
    } else {
        interleave_here(dev, bc, ks, k, rounds, opt, out);
    }
}

/* ---- a batch of candidates, one after another ----------------------- */

/* The stop threshold for the next candidate of a batch. */
static double batch_stop(const job_batch *b, double fastest)
{
    return b->stop_above ? b->stop_above(fastest) : 0;
}

/* Measures candidates [from, k) in order, tracking the fastest. */
static void measure_run(attnres_device *dev, bench_case *bc, const job_batch *b, size_t from, double fastest,
                        job_result *out, int fd)
{
    for (size_t i = from; i < b->k; i++) {
        job_options o = *b->opt;
        o.policy.stop_above_us = batch_stop(b, fastest);
        if (i > from && b->warm_once_above_us > 0 && fastest > b->warm_once_above_us)
            o.policy.warmup = 0;
        /* Only a measuring child may end itself at a deadline. */
        cut_plan cut = {fd, fd >= 0 && b->cut_after ? b->cut_after(fastest, o.policy.warmup + 1) : 0};
        job_result r;
        measure_here(dev, bc, &b->ks[i], &o, &cut, &r);
        if (r.status == ARDB_STATUS_OK && r.tm.median_us < fastest)
            fastest = r.tm.median_us;
        if (fd >= 0 && write_all(fd, &r, sizeof r))
            _exit(4);
        if (out)
            out[i] = r;
    }
}

typedef struct batch_child_arg {
    const job_batch *b;
    size_t from;
    double fastest;
} batch_child_arg;

static void child_batch(attnres_device *dev, bench_case *bc, const void *argp, int fd)
{
    const batch_child_arg *a = argp;
    /* The copies of the written pages, before any deadline runs. */
    bench_case_touch(bc);
    measure_run(dev, bc, a->b, a->from, a->fastest, NULL, fd);
}

void job_measure_batch(attnres_device *dev, bench_case *bc, const job_batch *b, job_result *out)
{
    double fastest = b->fastest_us;
    if (!(b->opt->isolate && strcmp(dev->backend, "cpu") == 0)) {
        measure_run(dev, bc, b, 0, fastest, out, -1);
        return;
    }
    /* One child measures the batch, each result sent as it is done; a
     * child that dies or overruns a candidate's time limit costs that
     * candidate only, and a new child goes on after it. */
    size_t next = 0;
    while (next < b->k) {
        batch_child_arg a = {b, next, fastest};
        int fd = -1;
        char err[256];
        pid_t pid = fork_child(bc, child_batch, &a, &fd, err, sizeof err);
        if (pid < 0) {
            for (; next < b->k; next++) {
                result_clear(&out[next]);
                out[next].status = ARDB_STATUS_LAUNCH_FAILED;
                set_message(&out[next], "%s", err);
            }
            return;
        }
        int timed_out = 0, cut = 0;
        while (next < b->k && !cut) {
            double limit = b->opt->time_limit_s;
            if (read_by(fd, &out[next], sizeof out[next], limit > 0 ? artuner_now_s() + limit : 0, &timed_out))
                break;
            if (out[next].status == ARDB_STATUS_OK && out[next].tm.median_us < fastest)
                fastest = out[next].tm.median_us;
            cut = out[next].cut;
            next++;
        }
        int ws = reap(pid, fd, timed_out);
        if (!cut && next < b->k) {
            result_clear(&out[next]);
            child_failed(&out[next], timed_out, ws, b->opt->time_limit_s);
            next++;
        }
    }
}

