"""The tuned path of the mix backward, end to end: a problems file with one
mix_backward problem (f32 d=64 N=3 H=2 additive, T bucket 16) is tuned on the
CPU into a fresh database (the quick random strategy, two candidates); `attnres
plan --op mix_backward --require-exact` finds its winner at the exact level
(and refuses a problem that was not tuned); `attnres run --op mix_backward
--require-exact` with that database runs the tuned variant, whose gradients
match the independent fp64 reference (reference.mix_backward) within 1e-5 at
T = 16 and at T = 5, and whose output files are byte-identical over two runs.

Arguments: the attnres binary. The tune takes some 10 seconds, most of it
measuring the machine's memory ceilings, which every run records."""

import math
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from compare import dalpha_err, flat, rel_err  # noqa: E402
import npyio  # noqa: E402
import reference  # noqa: E402

CLI = sys.argv[1]
N, D, H = 3, 64, 2
GRADS = ("dsources", "dquery", "dgain", "dpartial", "dalpha")
failures = 0


def report(good, what):
    global failures
    print(("ok   " if good else "FAIL ") + what)
    if not good:
        failures += 1


with tempfile.TemporaryDirectory() as tmp:
    p = lambda f: os.path.join(tmp, f)  # noqa: E731
    env = dict(os.environ)
    env.pop("ATTNRES_MISS_FILE", None)
    # The suite's kernel cache spares compiles that an earlier test made.
    if env.get("ATTNRES_TEST_KERNEL_CACHE"):
        env["ATTNRES_CACHE_DIR"] = env["ATTNRES_TEST_KERNEL_CACHE"]

    def cli(args):
        return subprocess.run([CLI] + args, capture_output=True, text=True, env=env)

    db = p("t.db")
    with open(p("problems.txt"), "w") as f:
        f.write("# op dtype d n heads form epilogue T-buckets\n")
        f.write("mix_backward\tf32\t%d\t%d\t%d\tadditive\t0\t16\n" % (D, N, H))
    res = cli(["tune", "--device", "cpu", "--problems", p("problems.txt"), "--db", db, "--strategy", "random",
               "--budget", "2", "--quiet"])
    tuned = res.returncode == 0 and "0 not ok" in res.stderr + res.stdout
    report(tuned, "tune of a mix_backward problem: exit %d %s" % (
        res.returncode, (res.stdout + res.stderr).strip().splitlines()[-1:] if tuned else res.stdout + res.stderr))
    if not tuned:
        sys.exit(1)

    shape = ["--op", "mix_backward", "--dtype", "f32", "--d", str(D), "--n", str(N), "--heads", str(H), "--additive"]
    res = cli(["plan", "--device", "cpu", "--db", db, "--require-exact", "--explain"] + shape)
    variant = ""
    for line in res.stdout.splitlines():
        if line.strip().startswith("T bucket 16:"):
            variant = line.split(":", 1)[1].split()[0]
    exact = res.returncode == 0 and "plan level: exact device" in res.stdout and variant.startswith("mix_backward_")
    report(exact, "plan --require-exact finds the tuned winner %s%s" % (variant, "" if exact else ":\n" + res.stdout +
                                                                        res.stderr))
    res = cli(["plan", "--device", "cpu", "--db", db, "--require-exact"] + shape[:-1])
    report(res.returncode != 0 and "exact match was required" in res.stderr,
           "plan --require-exact refuses the untuned replace form: " + res.stderr.strip()[:160])

    # A revalidation re-measures the backward winner as it does the forward
    # ones (verified, then timed), and says ok.
    res = cli(["tune", "--revalidate", "--device", "cpu", "--db", db, "--quiet"])
    row = [line for line in res.stdout.splitlines() if line.startswith("mix_backward:")]
    report(res.returncode == 0 and len(row) == 1 and " ok" in row[0],
           "tune --revalidate re-measures the backward winner: %s" % (row[0] if row else res.stdout + res.stderr))

    rng = random.Random()
    for t in (16, 5):
        sources = [[[reference.round_f32(10 ** rng.uniform(-1, 1) * rng.gauss(0, 1)) for _ in range(D)]
                    for _ in range(t)] for _ in range(N)]
        query = [reference.round_f32(2 * rng.gauss(0, 1) / math.sqrt(D)) for _ in range(D)]
        gain = [reference.round_f32(1 + 0.25 * rng.gauss(0, 1)) for _ in range(D)]
        partial = [[reference.round_f32(rng.gauss(0, 1)) for _ in range(D)] for _ in range(t)]
        dout = [[reference.round_f32(rng.gauss(0, 1)) for _ in range(D)] for _ in range(t)]
        npyio.write_f32(p("s.npy"), (N, t, D), flat(sources))
        npyio.write_f32(p("w.npy"), (D,), query)
        npyio.write_f32(p("g.npy"), (D,), gain)
        npyio.write_f32(p("p.npy"), (t, D), flat(partial))
        npyio.write_f32(p("do.npy"), (t, D), flat(dout))
        want = reference.mix_backward(sources, query, dout, gain, H, 1e-6, 1.0, partial, 0.5)
        run = ["run", "--op", "mix_backward", "--device", "cpu", "--db", db, "--require-exact", "--heads", str(H),
               "--sources", p("s.npy"), "--query", p("w.npy"), "--gain", p("g.npy"), "--partial", p("p.npy"),
               "--alpha", "0.5", "--dout", p("do.npy")] + sum((["--" + g, p(g + ".npy")] for g in GRADS), [])
        runs = []
        for _ in range(2):
            res = cli(run)
            if res.returncode != 0:
                report(False, "run --require-exact at T = %d: %s" % (t, res.stderr.strip()))
                break
            files = {}
            for g in GRADS:
                with open(p(g + ".npy"), "rb") as f:
                    files[g] = f.read()
            runs.append(files)
        if len(runs) != 2:
            continue
        errs = {g: rel_err(npyio.read_f32(p(g + ".npy"))[1], flat(want[g])) for g in GRADS if g != "dalpha"}
        errs["dalpha"] = dalpha_err(npyio.read_f32(p("dalpha.npy"))[1], flat(want["dalpha"]), sources, dout)
        report(all(e <= 1e-5 for e in errs.values()), "tuned run at T = %d against the reference: %s" % (
            t, ", ".join("%s %.1e" % (g, e) for g, e in errs.items())))
        report(runs[0] == runs[1], "tuned run at T = %d: two runs give byte-identical files" % t)

print("%d failed" % failures)
sys.exit(1 if failures else 0)
