"""`attnres run --op phase1|phase2` (Block AttnRes, two-phase form) against the
independent fp64 reference (reference.py), on fresh random inputs whose rows
differ in magnitude by 100x: fp32 within 1e-5 relative, bf16 and f16 within
1e-2 of the reference computed from the rounded inputs.

Also checks the identity the two-phase form rests on: phase1 over n block
sources followed by phase2 with the partial sum b equals `--op mix` over the
n + 1 sources with b last (fp32, 1e-5); that NaN stays in its token; and that
bad input is refused with a message and no output file."""

import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from compare import flat, rel_err  # noqa: E402
import npyio  # noqa: E402
import one_case  # noqa: E402
import reference  # noqa: E402

one_case.take_args(1)
CLI = sys.argv[1]
# The device under test (the CPU by default; tests/cudasim runs this file on
# the simulated CUDA device) and an optional database of tuned winners.
DEVICE = os.environ.get("ATTNRES_TEST_DEVICE", "cpu")
DB = sys.argv[2] if len(sys.argv) > 2 else None
rng = random.Random()


def report(ok, name, detail):
    one_case.record(name, [] if ok else [detail], detail)


def rows(t, d, rnd, vary=True):
    """t rows of d values, each row scaled by 10^U(-1,1) (100x apart)."""
    out = []
    for _ in range(t):
        mag = 10 ** rng.uniform(-1, 1) if vary else 1.0
        out.append([rnd(mag * rng.gauss(0, 1)) for _ in range(d)])
    return out


def vec(d, mean=0.0, spread=1.0):
    return [reference.round_f32(mean + spread * rng.gauss(0, 1)) for _ in range(d)]


def run(args):
    db = ["--db", DB] if DB else []
    return subprocess.run([CLI, "run", "--device", DEVICE] + db + args, capture_output=True, text=True)


def write(path, shape, data):
    npyio.write_f32(path, shape, flat(data))


def read(path):
    return npyio.read_f32(path)


# ---- phase1 against the reference -------------------------------------------

def check_phase1(name, n, s, t, d, heads=1, dtype="f32", gains=True, scale=1.0):
    if not one_case.wanted(name):
        return
    rnd = reference.ROUND[dtype]
    sources = [rows(t, d, rnd) for _ in range(n)]
    queries = [vec(d, 0.0, 3 / math.sqrt(d)) for _ in range(s)]
    g = [vec(d, 1.0, 0.2) for _ in range(s)] if gains else None
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda f: os.path.join(tmp, f)  # noqa: E731
        write(p("s.npy"), (n, t, d), sources)
        write(p("q.npy"), (s, d), queries)
        args = ["--op", "phase1", "--sources", p("s.npy"), "--queries", p("q.npy"), "--heads", str(heads),
                "--eps", "1e-5", "--scale", repr(scale), "--dtype", dtype, "--out", p("o1.npy"),
                "--lse", p("lse.npy")]
        if gains:
            write(p("g.npy"), (s, d), g)
            args += ["--gains", p("g.npy")]
        res = run(args)
        if res.returncode != 0:
            report(False, name, "exit %d: %s" % (res.returncode, res.stderr.strip()))
            return
        shape_o, got_o = read(p("o1.npy"))
        shape_l, got_l = read(p("lse.npy"))
    want_o, want_l = reference.phase1(sources, queries, g, heads, 1e-5, scale)
    if shape_o != (s, t, d) or shape_l != (s, t, heads):
        report(False, name, "shapes %s %s" % (shape_o, shape_l))
        return
    tol = 1e-5 if dtype == "f32" else 1e-2
    err = reference.worst([rel_err(got_o, flat(want_o)), rel_err(got_l, flat(want_l))])
    report(err <= tol, name, "rel err %.2e (tol %.0e)" % (err, tol))


# ---- phase2 against the reference -------------------------------------------

def check_phase2(name, t, d, heads=1, dtype="f32", fuse=False, epilogue=False, gain=True):
    if not one_case.wanted(name):
        return
    rnd = reference.ROUND[dtype]
    o1 = rows(t, d, rnd)
    lse = [[reference.round_f32(rng.gauss(0, 2) + math.log(5)) for _ in range(heads)] for _ in range(t)]
    b = rows(t, d, rnd)
    f = rows(t, d, rnd) if fuse else None
    w = vec(d, 0.0, 3 / math.sqrt(d))
    g = vec(d, 1.0, 0.2) if gain else None
    go = vec(d, 1.0, 0.1) if epilogue else None
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda x: os.path.join(tmp, x)  # noqa: E731
        write(p("o1.npy"), (t, d), o1)
        write(p("lse.npy"), (t, heads), lse)
        write(p("b.npy"), (t, d), b)
        write(p("w.npy"), (d,), w)
        args = ["--op", "phase2", "--o1", p("o1.npy"), "--lse", p("lse.npy"), "--partial", p("b.npy"),
                "--query", p("w.npy"), "--eps", "1e-5", "--dtype", dtype, "--out", p("out.npy")]
        if gain:
            write(p("g.npy"), (d,), g)
            args += ["--gain", p("g.npy")]
        if fuse:
            write(p("f.npy"), (t, d), f)
            args += ["--sublayer", p("f.npy"), "--partial-out", p("b2.npy")]
        if epilogue:
            write(p("go.npy"), (d,), go)
            args += ["--out-gain", p("go.npy"), "--out-eps", "1e-5", "--normed", p("normed.npy")]
        res = run(args)
        if res.returncode != 0:
            report(False, name, "exit %d: %s" % (res.returncode, res.stderr.strip()))
            return
        want_out, want_normed, want_b = reference.phase2(o1, lse, b, w, g, heads, 1e-5, 1.0, f, go, 1e-5)
        shape, got = read(p("out.npy"))
        errs = [rel_err(got, flat(want_out))]
        if shape != (t, d):
            report(False, name, "out shape %s" % (shape,))
            return
        if epilogue:
            errs.append(rel_err(read(p("normed.npy"))[1], flat(want_normed)))
        if fuse:
            errs.append(rel_err(read(p("b2.npy"))[1], flat(want_b)))
        elif os.path.exists(p("b2.npy")):
            report(False, name, "wrote a partial without --partial-out")
            return
    tol = 1e-5 if dtype == "f32" else 1e-2
    err = reference.worst(errs)
    report(err <= tol, name, "rel err %.2e (tol %.0e)" % (err, tol))


# ---- phase1 + phase2 == mix over n + 1 sources --------------------------------

def check_identity(name, n, s, t, d, heads=1, fuse=False, epilogue=False):
    """Runs phase1 for s sites, then phase2 per site, and compares each site's
    output with --op mix over the n sources plus b (after the fused add)."""
    if not one_case.wanted(name):
        return
    sources = [rows(t, d, reference.round_f32) for _ in range(n)]
    queries = [vec(d, 0.0, 3 / math.sqrt(d)) for _ in range(s)]
    gains = [vec(d, 1.0, 0.2) for _ in range(s)]
    b0 = rows(t, d, reference.round_f32)
    f = rows(t, d, reference.round_f32) if fuse else None
    # The kernel adds in fp32; the mix gets exactly that sum as its last source.
    b = [[reference.round_f32(b0[i][k] + f[i][k]) for k in range(d)] for i in range(t)] if fuse else b0
    go = vec(d, 1.0, 0.1) if epilogue else None
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda x: os.path.join(tmp, x)  # noqa: E731
        write(p("s.npy"), (n, t, d), sources)
        write(p("q.npy"), (s, d), queries)
        write(p("g.npy"), (s, d), gains)
        write(p("b0.npy"), (t, d), b0)
        write(p("full.npy"), (n + 1, t, d), sources + [b])
        common = ["--heads", str(heads), "--eps", "1e-5", "--scale", "0.75"]
        res = run(["--op", "phase1", "--sources", p("s.npy"), "--queries", p("q.npy"), "--gains", p("g.npy"),
                   "--out", p("o1.npy"), "--lse", p("lse.npy")] + common)
        if res.returncode != 0:
            report(False, name, "phase1 exit %d: %s" % (res.returncode, res.stderr.strip()))
            return
        _, o1 = read(p("o1.npy"))
        _, lse = read(p("lse.npy"))
        if fuse:
            write(p("f.npy"), (t, d), f)
        if epilogue:
            write(p("go.npy"), (d,), go)
        for j in range(s):
            write(p("o1_%d.npy" % j), (t, d), o1[j * t * d:(j + 1) * t * d])
            write(p("lse_%d.npy" % j), (t, heads), lse[j * t * heads:(j + 1) * t * heads])
            write(p("w_%d.npy" % j), (d,), queries[j])
            write(p("g_%d.npy" % j), (d,), gains[j])
            args = ["--op", "phase2", "--o1", p("o1_%d.npy" % j), "--lse", p("lse_%d.npy" % j), "--partial",
                    p("b0.npy"), "--query", p("w_%d.npy" % j), "--gain", p("g_%d.npy" % j),
                    "--out", p("two_%d.npy" % j)] + common
            mix = ["--sources", p("full.npy"), "--query", p("w_%d.npy" % j), "--gain", p("g_%d.npy" % j),
                   "--out", p("mix_%d.npy" % j)] + common
            if fuse:
                args += ["--sublayer", p("f.npy"), "--partial-out", p("b2_%d.npy" % j)]
            if epilogue:
                args += ["--out-gain", p("go.npy"), "--out-eps", "1e-5", "--normed", p("two_n_%d.npy" % j)]
                mix += ["--out-gain", p("go.npy"), "--out-eps", "1e-5", "--normed", p("mix_n_%d.npy" % j)]
            for what, a in (("phase2", args), ("mix", mix)):
                res = run(a)
                if res.returncode != 0:
                    report(False, name, "%s exit %d: %s" % (what, res.returncode, res.stderr.strip()))
                    return
            worst = reference.worst([worst, rel_err(read(p("two_%d.npy" % j))[1], read(p("mix_%d.npy" % j))[1])])
            if epilogue:
                worst = reference.worst([worst, rel_err(read(p("two_n_%d.npy" % j))[1],
                                                        read(p("mix_n_%d.npy" % j))[1])])
            if fuse:
                worst = reference.worst([worst, rel_err(read(p("b2_%d.npy" % j))[1], flat(b))])
    report(worst <= 1e-5, name, "phase1+phase2 vs mix rel err %.2e (tol 1e-05)" % worst)


# ---- NaN stays in its token ---------------------------------------------------

def check_nan():
    if not one_case.wanted("NaN stays in its token"):
        return
    n, s, t, d = 3, 2, 4, 16
    sources = [rows(t, d, reference.round_f32) for _ in range(n)]
    sources[1][2][5] = math.nan  # source 1, token 2
    queries = [vec(d) for _ in range(s)]
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda x: os.path.join(tmp, x)  # noqa: E731
        write(p("s.npy"), (n, t, d), sources)
        write(p("q.npy"), (s, d), queries)
        res = run(["--op", "phase1", "--sources", p("s.npy"), "--queries", p("q.npy"), "--heads", "2",
                   "--out", p("o1.npy"), "--lse", p("lse.npy")])
        if res.returncode != 0:
            report(False, "phase1 NaN in one token", "exit %d: %s" % (res.returncode, res.stderr.strip()))
            return
        _, o1 = read(p("o1.npy"))
        _, lse = read(p("lse.npy"))
        bad = sorted({(i // d) % t for i, x in enumerate(o1) if math.isnan(x)} |
                     {(i // 2) % t for i, x in enumerate(lse) if math.isnan(x)})
        whole = all(math.isnan(o1[(j * t + 2) * d + k]) for j in range(s) for k in range(d))
        report(bad == [2] and whole, "phase1 NaN in token 2 reaches token 2 only", "tokens with NaN %s" % bad)

        o1_rows = rows(t, d, reference.round_f32)
        b = rows(t, d, reference.round_f32)
        b[1][3] = math.nan
        write(p("o1b.npy"), (t, d), o1_rows)
        write(p("lseb.npy"), (t, 1), [[0.5] for _ in range(t)])
        write(p("b.npy"), (t, d), b)
        write(p("w.npy"), (d,), vec(d))
        res = run(["--op", "phase2", "--o1", p("o1b.npy"), "--lse", p("lseb.npy"), "--partial", p("b.npy"),
                   "--query", p("w.npy"), "--out", p("out.npy")])
        if res.returncode != 0:
            report(False, "phase2 NaN in one token", "exit %d: %s" % (res.returncode, res.stderr.strip()))
            return
        _, out = read(p("out.npy"))
        bad = sorted({i // d for i, x in enumerate(out) if math.isnan(x)})
        report(bad == [1], "phase2 NaN in token 1 of b reaches token 1 only", "tokens with NaN %s" % bad)


# ---- bad input is refused, and nothing is written ------------------------------

def check_cuda_routing():
    """--op phase1/phase2 on a CUDA device goes to that device (no CPU-only
    gate any more): with a driver library that does not exist, the run fails
    opening cuda:0, naming the library, and writes nothing."""
    if not one_case.wanted("phase ops on cuda:0 reach the CUDA backend"):
        return
    tmp = tempfile.mkdtemp(prefix="attnres-phase-cuda-")
    p = lambda x: os.path.join(tmp, x)  # noqa: E731
    n, s, t, d = 2, 2, 3, 32
    write(p("s.npy"), (n, t, d), rows(t * n, d, reference.round_f32))
    write(p("q.npy"), (s, d), [vec(d) for _ in range(s)])
    write(p("o1.npy"), (t, d), rows(t, d, reference.round_f32))
    write(p("lse.npy"), (t, 1), [[0.5] for _ in range(t)])
    write(p("b.npy"), (t, d), rows(t, d, reference.round_f32))
    write(p("w.npy"), (d,), vec(d))
    missing = p("no-such-libcuda.so")
    env = dict(os.environ, ATTNRES_CUDA_DRIVER=missing)
    cases = {
        "phase1": ["--op", "phase1", "--sources", p("s.npy"), "--queries", p("q.npy"), "--out", p("out.npy"),
                   "--lse", p("lse_out.npy")],
        "phase2": ["--op", "phase2", "--o1", p("o1.npy"), "--lse", p("lse.npy"), "--partial", p("b.npy"),
                   "--query", p("w.npy"), "--out", p("out.npy")],
    }
    try:
        for op, args in cases.items():
            res = subprocess.run([CLI, "run", "--device", "cuda:0"] + args, capture_output=True, text=True,
                                 env=env)
            problems = []
            if res.returncode != 1:
                problems.append("exit status %d" % res.returncode)
            if "cannot open device cuda:0" not in res.stderr or missing not in res.stderr:
                problems.append("message %r does not name cuda:0 and the driver" % res.stderr.strip())
            if "cpu backend only" in res.stderr.lower():
                problems.append("still gated to the CPU")
            if os.path.exists(p("out.npy")) or os.path.exists(p("lse_out.npy")):
                problems.append("wrote an output")
            report(not problems, "--op %s --device cuda:0 reaches the CUDA backend" % op,
                   "; ".join(problems) if problems else res.stderr.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp)


def check_refusals():
    if not one_case.wanted("bad input is refused, and nothing is written"):
        return
    tmp = tempfile.mkdtemp(prefix="attnres-phase-bad-")
    p = lambda x: os.path.join(tmp, x)  # noqa: E731
    n, s, t, d = 3, 2, 4, 16
    write(p("s.npy"), (n, t, d), rows(t, d, reference.round_f32) * n)
    write(p("q.npy"), (s, d), [vec(d) for _ in range(s)])
    write(p("q_short.npy"), (s, d - 1), [vec(d - 1) for _ in range(s)])
    write(p("g_wrong.npy"), (s + 1, d), [vec(d) for _ in range(s + 1)])
    write(p("o1.npy"), (t, d), rows(t, d, reference.round_f32))
    write(p("lse.npy"), (t, 2), [[0.1, 0.2] for _ in range(t)])
    write(p("lse3.npy"), (t, 3), [[0.1, 0.2, 0.3] for _ in range(t)])
    write(p("lse_t.npy"), (t + 1, 2), [[0.1, 0.2] for _ in range(t + 1)])
    write(p("b.npy"), (t, d), rows(t, d, reference.round_f32))
    write(p("b_wrong.npy"), (t, d + 1), rows(t, d + 1, reference.round_f32))
    write(p("w.npy"), (d,), vec(d))
    write(p("w_short.npy"), (d - 2,), vec(d - 2))
    outputs = ["out.npy", "lse_out.npy", "normed.npy", "b2.npy"]

    phase1 = ["--op", "phase1", "--sources", p("s.npy"), "--queries", p("q.npy"), "--lse", p("lse_out.npy")]
    phase2 = ["--op", "phase2", "--o1", p("o1.npy"), "--lse", p("lse.npy"), "--partial", p("b.npy"),
              "--query", p("w.npy")]

    def refuse(name, args, needle, out=True):
        for f in outputs:
            if os.path.exists(p(f)):
                os.remove(p(f))
        res = run(args + (["--out", p("out.npy")] if out else []))
        problems = []
        if res.returncode == 0:
            problems.append("exit status 0")
        if needle.lower() not in res.stderr.lower():
            problems.append("message %r lacks %r" % (res.stderr.strip(), needle))
        left = [f for f in os.listdir(tmp) if any(f.startswith(o) for o in outputs)]
        if left:
            problems.append("left files %s" % left)
        msg = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
        report(not problems, "refuses: " + name, "; ".join(problems) if problems else msg)

    def swap(args, flag, value):
        args = list(args)
        args[args.index(flag) + 1] = value
        return args

    refuse("unknown op", ["--op", "phase3"] + phase1[2:], "--op must be")
    refuse("phase1 queries of another d", swap(phase1, "--queries", p("q_short.npy")), "(S, d)")
    refuse("phase1 gains of another shape", phase1 + ["--gains", p("g_wrong.npy")], "--gains")
    refuse("phase1 without --lse", phase1[:-2], "requires")
    refuse("phase1 given --query", phase1 + ["--query", p("w.npy")], "not used by --op phase1")
    refuse("phase1 given an epilogue", phase1 + ["--out-gain", p("w.npy"), "--normed", p("normed.npy")],
           "not used by --op phase1")
    refuse("phase1 heads do not divide d", phase1 + ["--heads", "3"], "does not divide")
    refuse("phase1 --out and --lse the same file", swap(phase1, "--lse", p("out.npy")), "same file")
    refuse("phase1 lse unwritable (out removed again)", swap(phase1, "--lse", p("absent/dir/lse.npy")),
           "absent")
    refuse("phase1 eps zero", phase1 + ["--eps", "0"], "--eps")
    refuse("phase2 lse of another T", swap(phase2, "--lse", p("lse_t.npy")), "(T, H)")
    refuse("phase2 --heads disagrees with lse", phase2 + ["--heads", "4"], "does not match")
    refuse("phase2 H from lse does not divide d", swap(phase2, "--lse", p("lse3.npy")), "does not divide")
    refuse("phase2 partial of another shape", swap(phase2, "--partial", p("b_wrong.npy")), "--partial")
    refuse("phase2 query of another d", swap(phase2, "--query", p("w_short.npy")), "--query")
    refuse("phase2 sublayer without --partial-out", phase2 + ["--sublayer", p("b.npy")], "--partial-out")
    refuse("phase2 --partial-out without sublayer", phase2 + ["--partial-out", p("b2.npy")], "--sublayer")
    refuse("phase2 given --alpha", phase2 + ["--alpha", "0.5"], "--alpha")
    refuse("phase2 given --sources", phase2 + ["--sources", p("s.npy")], "not used by --op phase2")
    refuse("phase2 epilogue half given", phase2 + ["--out-gain", p("w.npy")], "epilogue")
    refuse("phase2 missing --o1", phase2[:2] + phase2[4:], "requires")
    refuse("phase2 partial-out unwritable (out removed again)",
           phase2 + ["--sublayer", p("b.npy"), "--partial-out", p("absent/dir/b2.npy")], "absent")
    refuse("mix given --queries", ["--sources", p("s.npy"), "--query", p("w.npy"), "--queries", p("q.npy")],
           "not used by --op mix")
    shutil.rmtree(tmp, ignore_errors=True)


def check_empty():
    """T = 0 is a successful no-op that writes empty arrays."""
    if not one_case.wanted("T = 0 writes empty outputs"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda x: os.path.join(tmp, x)  # noqa: E731
        npyio.write_f32(p("s.npy"), (2, 0, 8), [])
        write(p("q.npy"), (3, 8), [vec(8) for _ in range(3)])
        res = run(["--op", "phase1", "--sources", p("s.npy"), "--queries", p("q.npy"), "--heads", "2",
                   "--out", p("o1.npy"), "--lse", p("lse.npy")])
        ok = res.returncode == 0 and read(p("o1.npy"))[0] == (3, 0, 8) and read(p("lse.npy"))[0] == (3, 0, 2)
        report(ok, "phase1 with T = 0 writes empty outputs", res.stderr.strip())


check_phase1("phase1 f32 n=3 S=1 T=5 d=64", 3, 1, 5, 64)
check_phase1("phase1 f32 n=1 S=2 T=3 d=32 (o1 = v0)", 1, 2, 3, 32)
check_phase1("phase1 f32 n=5 S=4 T=7 d=128 H=4", 5, 4, 7, 128, heads=4)
check_phase1("phase1 f32 n=9 S=3 T=17 d=96 H=8 scale 0.5", 9, 3, 17, 96, heads=8, scale=0.5)
check_phase1("phase1 f32 odd d=37 n=4 S=3 T=2 no gains", 4, 3, 2, 37, gains=False)
check_phase1("phase1 bf16 n=6 S=3 T=4 d=128 H=2", 6, 3, 4, 128, heads=2, dtype="bf16")
check_phase1("phase1 f16 n=4 S=2 T=3 d=64", 4, 2, 3, 64, dtype="f16")
check_phase2("phase2 f32 T=5 d=64", 5, 64)
check_phase2("phase2 f32 T=7 d=128 H=4 fused add", 7, 128, heads=4, fuse=True)
check_phase2("phase2 f32 T=9 d=96 H=8 epilogue", 9, 96, heads=8, epilogue=True)
check_phase2("phase2 f32 T=3 d=37 fused add epilogue no gain", 3, 37, fuse=True, epilogue=True, gain=False)
check_phase2("phase2 f32 T=33 d=256 H=2 fused add epilogue", 33, 256, heads=2, fuse=True, epilogue=True)
check_phase2("phase2 bf16 T=4 d=128 H=2 fused add epilogue", 4, 128, heads=2, dtype="bf16", fuse=True,
             epilogue=True)
check_phase2("phase2 f16 T=3 d=64 epilogue", 3, 64, dtype="f16", epilogue=True)
check_identity("identity n=4 S=1 T=5 d=64", 4, 1, 5, 64)
check_identity("identity n=3 S=3 T=6 d=128 H=4", 3, 3, 6, 128, heads=4)
check_identity("identity n=1 S=2 T=4 d=32 fused add epilogue", 1, 2, 4, 32, fuse=True, epilogue=True)
check_identity("identity n=8 S=2 T=9 d=96 H=8 epilogue", 8, 2, 9, 96, heads=8, epilogue=True)
if DB:
    # The ci preset's phase shapes, so the tuned winners run rather than the
    # generic kernels.
    check_phase1("tuned: phase1 f32 n=4 S=3 T=64 d=256", 4, 3, 64, 256)
    check_phase2("tuned: phase2 f32 T=64 d=256 fused add epilogue", 64, 256, fuse=True, epilogue=True)
check_nan()
check_empty()
if DEVICE == "cpu":
    check_cuda_routing()
check_refusals()
one_case.finish()
