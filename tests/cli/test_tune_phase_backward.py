"""The tuned path of the Block AttnRes phases' backwards, end to end: a
problems file with one phase1_backward problem (f32 d=64 N=3 S=2 H=2, T bucket
16) and one phase2_backward problem (f32 d=64 H=2 with the fused add and the
epilogue, so that every gradient is verified, T bucket 16) is tuned on the CPU
into a fresh database with the exhaustive strategy. Every candidate the tune
counts is recorded verified (status ok, its worst gradient error within fp32's
1e-5), under the problem fields the runtime's plans look up (phase 2's fused
add as the form "fused", phase 1's S); `attnres plan --op ... --require-exact`
finds each problem's recorded winner at the exact level and states the
workspace a run needs (attnres_plan_workspace_size), and refuses a problem that
was not tuned (phase2_backward without the fused add); and `attnres tune
--revalidate` re-measures both winners (verified again, then timed) and says
ok.

Arguments: the attnres binary. The tune takes some 12 seconds, most of it
measuring the machine's memory ceilings, which every run records (the
revalidation measures them again); with the suite's kernel cache holding
these variants from an earlier run, nothing is compiled."""

import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile

CLI = sys.argv[1]
D, N, S, H, T = 64, 3, 2, 2, 16
failures = 0


def report(good, what):
    global failures
    print(("ok   " if good else "FAIL ") + what)
    if not good:
        failures += 1


def workspace_bytes(row, tokens, epilogue):
    """ar_mix_backward_workspace (runtime/src/device.h): each group of 32
    tokens' fp32 row of the query gradients (row floats), padded to 64
    bytes, once more for d(out_gain), then a float per group."""
    groups = (tokens + 31) // 32
    padded = (groups * row * 4 + 63) // 64 * 64
    return padded * (2 if epilogue else 1) + groups * 4


with tempfile.TemporaryDirectory() as tmp:
    p = lambda f: os.path.join(tmp, f)  # noqa: E731
    env = dict(os.environ)
    env.pop("ATTNRES_MISS_FILE", None)
    # The suite's kernel cache spares compiles that an earlier run made.
    if env.get("ATTNRES_TEST_KERNEL_CACHE"):
        env["ATTNRES_CACHE_DIR"] = env["ATTNRES_TEST_KERNEL_CACHE"]

    def cli(args):
        return subprocess.run([CLI] + args, capture_output=True, text=True, env=env)

    db = p("t.db")
    with open(p("problems.txt"), "w") as f:
        f.write("# op dtype d n heads form epilogue T-buckets options\n")
        f.write("phase1_backward f32 %d %d %d replace 0 %d s=%d\n" % (D, N, H, T, S))
        f.write("phase2_backward\tf32\t%d\t1\t%d\treplace\t1\t%d\tfuse=1\n" % (D, H, T))
    res = cli(["tune", "--device", "cpu", "--problems", p("problems.txt"), "--db", db, "--strategy", "exhaustive"])
    out = res.stdout + res.stderr
    # "[1/2] phase1_backward f32 d=64 ... T=16: 13 candidate(s), 0 reused, 0 not ok, 0.4 s; winner ..."
    counted = {m.group(1): (int(m.group(2)), int(m.group(3)))
               for m in re.finditer(r"^\[\d+/2\] (\w+) .*: (\d+) candidate\(s\), \d+ reused, (\d+) not ok", out, re.M)}
    tuned = res.returncode == 0 and sorted(counted) == ["phase1_backward", "phase2_backward"] and \
        all(c > 0 and bad == 0 for c, bad in counted.values())
    report(tuned, "exhaustive tune of a phase1_backward and a phase2_backward problem: exit %d, %s%s" % (
        res.returncode, counted, "" if tuned else "\n" + out))
    if not tuned:
        sys.exit(1)

    # Every candidate counted was verified: its measurement outside the
    # final round is ok with its worst gradient error recorded, within fp32's
    # tolerance (the sums and dlse are held to it in every dtype, and here
    # every gradient is fp32).
    con = sqlite3.connect(db)
    winners = {}
    for op, (count, _) in sorted(counted.items()):
        rows = con.execute(
            "select c.variant, m.status, m.rel_err from measurements m join candidates c on c.id = m.candidate_id "
            "join problems q on q.id = m.problem_id where q.op = ? and m.final_round = 0", (op,)).fetchall()
        variants = {v for v, _, _ in rows}
        bad = [(v, st, e) for v, st, e in rows
               if st != "ok" or e is None or not math.isfinite(e) or e > 1e-5 or not v.startswith(op + "_c_f32_")]
        report(len(variants) == count and not bad,
               "%s: %d candidates, each recorded verified (worst error %.2g)%s" % (
                   op, len(variants), max((e for _, _, e in rows if e is not None), default=float("nan")),
                   "" if not bad and len(variants) == count else ": %d recorded, not ok: %s" % (len(variants), bad)))
        fields = con.execute("select form, n, heads, epilogue, s, t_bucket from problems where op = ?",
                             (op,)).fetchall()
        want = [("replace", N, H, 0, S, T)] if op == "phase1_backward" else [("fused", 1, H, 1, 0, T)]
        report(fields == want, "%s recorded as %s" % (op, fields))
        w = con.execute("select c.variant from winners w join candidates c on c.id = w.candidate_id "
                        "join problems q on q.id = w.problem_id where q.op = ?", (op,)).fetchall()
        winners[op] = w[0][0] if len(w) == 1 else None
    con.close()

    # The plan finds each recorded winner at the exact level and states the
    # workspace a run of up to --tokens tokens needs.
    shapes = {
        "phase1_backward": (["--op", "phase1_backward", "--dtype", "f32", "--d", str(D), "--n", str(N), "--heads",
                             str(H), "--s", str(S)], 4096, workspace_bytes(D * S, 4096, 0)),
        "phase2_backward": (["--op", "phase2_backward", "--dtype", "f32", "--d", str(D), "--n", "1", "--heads",
                             str(H), "--epilogue", "--fuse-add", "--tokens", "100"], 100, workspace_bytes(D, 100, 1)),
    }
    for op, (shape, tokens, ws) in shapes.items():
        res = cli(["plan", "--device", "cpu", "--db", db, "--require-exact", "--explain"] + shape)
        variant = ""
        for line in res.stdout.splitlines():
            if line.strip().startswith("T bucket %d:" % T):
                variant = line.split(":", 1)[1].split()[0]
        stated = "workspace: %d bytes for up to %d tokens (attnres_plan_workspace_size)" % (ws, tokens)
        exact = res.returncode == 0 and "plan level: exact device" in res.stdout and variant == winners[op] and \
            stated in res.stdout
        report(exact, "plan --op %s --require-exact finds the tuned winner %s and says '%s'%s" % (
            op, variant, stated, "" if exact else ":\n" + res.stdout + res.stderr))
    res = cli(["plan", "--device", "cpu", "--db", db, "--require-exact"] + shapes["phase2_backward"][0][:-3])
    report(res.returncode != 0 and "exact match was required" in res.stderr,
           "plan --require-exact refuses phase2_backward without the fused add: " + res.stderr.strip()[:160])

    # A revalidation re-measures the backward winners as it does the forward
    # ones (verified, then timed), from the problems as the database keeps
    # them (phase 2's "fused" form, phase 1's S), and says ok.
    res = cli(["tune", "--revalidate", "--device", "cpu", "--db", db, "--quiet"])
    rows = [line for line in res.stdout.splitlines() if line.startswith(("phase1_backward:", "phase2_backward:"))]
    report(res.returncode == 0 and len(rows) == 2 and all(" ok" in r for r in rows),
           "tune --revalidate re-measures both winners: %s" % (rows if len(rows) == 2 else res.stdout + res.stderr))

print("%d failed" % failures)
sys.exit(1 if failures else 0)
