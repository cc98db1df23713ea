"""`attnres run` against the independent fp64 reference (reference.py).

Cases cover the replace and additive forms, several heads, the output-norm
epilogue and several sizes, on fresh random inputs whose source rows differ
in magnitude by 100x. fp32 must match within 1e-5 relative; bf16 and f16
within 1e-2 of the reference computed from the rounded inputs."""

import math
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from compare import rel_err  # noqa: E402
import npyio  # noqa: E402
import one_case  # noqa: E402
import reference  # noqa: E402

one_case.take_args(1)
CLI = sys.argv[1]
# The device under test: the CPU by default; tests/cudasim runs this file on
# the simulated CUDA device too.
DEVICE = os.environ.get("ATTNRES_TEST_DEVICE", "cpu")
failures = 0
passed = 0


def check(name, n, t, d, heads=1, additive=False, epilogue=False, dtype="f32", db=None):
    global failures, passed
    if not one_case.wanted(name):
        return
    rng = random.Random()
    rnd = reference.ROUND[dtype]
    sources = []
    for _ in range(n):
        rows = []
        for _ in range(t):
            mag = 10 ** rng.uniform(-1, 1)  # rows differ by up to 100x
            rows.append([rnd(mag * rng.gauss(0, 1)) for _ in range(d)])
        sources.append(rows)
    query = [reference.round_f32(rng.gauss(0, 1) * 3 / math.sqrt(d)) for _ in range(d)]
    gain = [reference.round_f32(1 + 0.2 * rng.gauss(0, 1)) for _ in range(d)]
    partial = [[rnd(rng.gauss(0, 1)) for _ in range(d)] for _ in range(t)] if additive else None
    out_gain = [reference.round_f32(1 + 0.1 * rng.gauss(0, 1)) for _ in range(d)] if epilogue else None
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda f: os.path.join(tmp, f)  # noqa: E731
        npyio.write_f32(p("s.npy"), (n, t, d), [x for src in sources for row in src for x in row])
        npyio.write_f32(p("w.npy"), (d,), query)
        npyio.write_f32(p("g.npy"), (d,), gain)
        args = [CLI, "run", "--device", DEVICE, "--sources", p("s.npy"), "--query", p("w.npy"), "--gain",
                p("g.npy"), "--heads", str(heads), "--eps", "1e-5", "--dtype", dtype, "--out", p("out.npy")]
        if db:
            args += ["--db", db]
        if additive:
            npyio.write_f32(p("p.npy"), (t, d), [x for row in partial for x in row])
            args += ["--partial", p("p.npy"), "--alpha", "0.5"]
        if epilogue:
            npyio.write_f32(p("go.npy"), (d,), out_gain)
            args += ["--out-gain", p("go.npy"), "--out-eps", "1e-5", "--normed", p("normed.npy")]
        res = subprocess.run(args, capture_output=True, text=True)
        if res.returncode != 0:
            print("FAIL %s: exit %d: %s" % (name, res.returncode, res.stderr.strip()))
            failures += 1
            one_case.failed()
            return
        want_out, want_normed = reference.mix(sources, query, gain, heads, 1e-5, 1.0, partial, 0.5, out_gain, 1e-5)
        shape, got = npyio.read_f32(p("out.npy"))
        errs = [rel_err(got, [x for row in want_out for x in row])]
        if shape != (t, d):
            print("FAIL %s: out shape %s" % (name, shape))
            failures += 1
            one_case.failed()
            return
        if epilogue:
            _, got_n = npyio.read_f32(p("normed.npy"))
            errs.append(rel_err(got_n, [x for row in want_normed for x in row]))
    tol = 1e-5 if dtype == "f32" else 1e-2
    err = reference.worst(errs)
    ok = err <= tol
    print("%s %-44s rel err %.2e (tol %.0e)" % ("ok  " if ok else "FAIL", name, err, tol))
    if ok:
        passed += 1
    else:
        failures += 1
        one_case.failed()


db = sys.argv[2] if len(sys.argv) > 2 else None
check("replace N=9 T=5 d=64", 9, 5, 64)
check("replace N=1 T=3 d=32", 1, 3, 32)
check("replace N=4 T=17 d=256", 4, 17, 256)
check("additive N=5 T=7 d=128", 5, 7, 128, additive=True)
check("heads=4 N=6 T=6 d=128", 6, 6, 128, heads=4)
check("heads=8 additive epilogue N=3 T=4 d=64", 3, 4, 64, heads=8, additive=True, epilogue=True)
check("epilogue N=9 T=9 d=96", 9, 9, 96, epilogue=True)
check("odd d=37 N=3 T=2", 3, 2, 37)
check("bf16 replace N=9 T=4 d=128", 9, 4, 128, dtype="bf16")
check("f16 additive epilogue N=5 T=3 d=64", 5, 3, 64, additive=True, epilogue=True, dtype="f16")
if db:
    # The shapes of the ci preset, so the tuned (vectorised, threaded) winners
    # run rather than the generic kernel.
    check("tuned: f32 d=256 N=5 T=1", 5, 1, 256, db=db)
    check("tuned: f32 d=256 N=5 T=301", 5, 301, 256, db=db)
    check("tuned: bf16 d=512 N=9 H=4 additive epilogue T=64", 9, 64, 512, heads=4, additive=True, epilogue=True,
          dtype="bf16", db=db)
one_case.finish(passed, failures)
