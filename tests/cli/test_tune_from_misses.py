"""From a fallback to a tuned plan through the miss file, end to end.

A shape no preset has (mix f32 d=192 N=3 H=2 additive): `attnres plan`
explains that it falls back to the built-in kernel; `attnres run` with
ATTNRES_MISS_FILE set matches the fp64 reference and records the problem
and its T bucket once, however many runs meet it; `attnres tune
--from-misses` tunes it (the quick random strategy) into a fresh database;
planned again with that database the problem is at the exact level, `attnres
run --require-exact` matches the reference, and records nothing more. A
torn last line is skipped with a note; a damaged line is refused with its
line number."""

import math
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from compare import rel_err  # noqa: E402
import npyio  # noqa: E402
import reference  # noqa: E402

CLI = sys.argv[1]
N, T, D, H = 3, 5, 192, 2
failures = 0


def fail(msg):
    global failures
    print("FAIL " + msg)
    failures += 1


def ok(msg):
    print("ok   " + msg)


def cli(args, env, expect=0):
    res = subprocess.run([CLI] + args, capture_output=True, text=True, env=env)
    if res.returncode != expect:
        fail("attnres %s: exit %d (wanted %d): %s%s" % (" ".join(args[:2]), res.returncode, expect,
                                                       res.stdout[-2000:], res.stderr[-2000:]))
    return res


with tempfile.TemporaryDirectory() as tmp:
    p = lambda f: os.path.join(tmp, f)  # noqa: E731
    env = dict(os.environ)
    env["ATTNRES_CACHE_DIR"] = p("cache")
    env.pop("ATTNRES_MISS_FILE", None)
    rng = random.Random(15)
    sources = [[[reference.round_f32(10 ** rng.uniform(-1, 1) * rng.gauss(0, 1)) for _ in range(D)]
                for _ in range(T)] for _ in range(N)]
    query = [reference.round_f32(rng.gauss(0, 1) / math.sqrt(D)) for _ in range(D)]
    partial = [[reference.round_f32(rng.gauss(0, 1)) for _ in range(D)] for _ in range(T)]
    npyio.write_f32(p("s.npy"), (N, T, D), [x for src in sources for row in src for x in row])
    npyio.write_f32(p("w.npy"), (D,), query)
    npyio.write_f32(p("p.npy"), (T, D), [x for row in partial for x in row])
    want, _ = reference.mix(sources, query, None, H, 1e-6, 1.0, partial, 0.5, None, 1e-6)
    want = [x for row in want for x in row]
    shape = ["--dtype", "f32", "--d", str(D), "--n", str(N), "--heads", str(H), "--additive"]
    run = ["run", "--device", "cpu", "--sources", p("s.npy"), "--query", p("w.npy"), "--heads", str(H),
           "--partial", p("p.npy"), "--alpha", "0.5", "--out", p("out.npy")]

    def check_out(what):
        _, got = npyio.read_f32(p("out.npy"))
        err = rel_err(got, want)
        (ok if err <= 1e-5 else fail)("%s: rel err %.2e against the fp64 reference" % (what, err))

    # 1. No database: the plan says it falls back, and why.
    res = cli(["plan", "--device", "cpu"] + shape + ["--explain"], env)
    if "built-in generic kernel" in res.stdout and "fallback: no tuned kernel" in res.stdout:
        ok("plan without a database explains the fallback")
    else:
        fail("plan explanation lacks the fallback:\n" + res.stdout)

    # 2. Runs with the miss file set: right results, one line for the bucket.
    miss = p("misses.txt")
    env_miss = dict(env, ATTNRES_MISS_FILE=miss)
    for i in range(3):
        cli(run, env_miss)
        check_out("fallback run %d" % (i + 1))
    lines = open(miss).read().splitlines() if os.path.exists(miss) else []
    if len(lines) == 1 and " op=mix dtype=f32 d=192 n=3 heads=2 s=0 form=additive epilogue=0 fuse=0 t=8 " \
            "device=cpu|" in lines[0]:
        ok("three runs recorded one miss: " + lines[0][:100] + "...")
    else:
        fail("miss file after three runs: %r" % lines)

    # 3. A damaged line is refused, naming it; a torn last line is skipped.
    with open(p("damaged.txt"), "w") as f:
        f.write(lines[0] + "\n" + lines[0].replace("d=192", "d=193") + "\n" if lines else "x\n")
    res = cli(["tune", "--device", "cpu", "--from-misses", p("damaged.txt"), "--db", p("bad.db")], env, expect=2)
    if "damaged.txt:2:" in res.stderr and "sum" in res.stderr:
        ok("a damaged line is refused with its line number: " + res.stderr.strip()[:120])
    else:
        fail("damaged miss file: " + res.stderr)
    with open(miss, "a") as f:
        f.write(lines[0][:40] if lines else "")  # a write cut short

    # 4. Tune the misses: the quick strategy, into a fresh database.
    db = p("t.db")
    res = cli(["tune", "--device", "cpu", "--from-misses", miss, "--db", db, "--strategy", "random", "--budget", "2"],
              env)
    if "1 problem(s) to tune; skipped line(s) cut short" in res.stderr and "T=8" in res.stdout:
        ok("tune --from-misses tuned the recorded bucket, skipping the torn line")
    else:
        fail("tune --from-misses output:\n%s\n%s" % (res.stdout, res.stderr))

    # 5. Planned again: the exact level; the run matches and records nothing.
    res = cli(["plan", "--device", "cpu", "--db", db] + shape + ["--explain", "--require-exact"], env)
    if "plan level: exact device" in res.stdout:
        ok("planned again with the tuned database: exact device")
    else:
        fail("plan after tuning:\n" + res.stdout + res.stderr)
    before = open(miss).read()
    cli(run + ["--db", db, "--require-exact"], env_miss)
    check_out("tuned run")
    if open(miss).read() == before:
        ok("the tuned run recorded no miss")
    else:
        fail("the tuned run changed the miss file")

print("%d failed" % failures)
sys.exit(1 if failures else 0)
