"""`attnres run --op phase1_backward` and `--op phase2_backward` (the gradients
of Block AttnRes' two phases, DESIGN.md 1b) against the independent fp64
reference (reference.phase1_backward, reference.phase2_backward), on fresh
random inputs whose rows differ in magnitude by 100x: fp32 within 1e-5
relative, bf16 and f16 within 1e-2 of the reference computed from the rounded
inputs, per gradient. phase1_backward: H = 1 and 2, n = 1 and 3, S = 1 to 3,
with and without gains, with and without --dlse, --dsources-f32.
phase2_backward: H = 1 and 2, with and without a gain, with and without the
fused add (--fuse-add, --dsublayer) and the output-norm epilogue (--out-gain,
--dnormed, --dout-gain), with and without --dout.

Also: both references against central differences of reference.phase1 and
reference.phase2 (so the oracle is checked, not trusted); the chain phase1 ->
phase2 -> phase2_backward -> phase1_backward, all through the command line,
equals reference.mix_backward over the n block sources plus b; T = 0; two runs
give byte-identical files; an output that cannot be written leaves none of
the others; and bad input is refused with a message, leaving every file as
it was.

Arguments: the attnres binary, and optionally a database of tuned winners."""

import math
import os
import random
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
DB = sys.argv[2] if len(sys.argv) > 2 else None
rng = random.Random()
EPS = 1e-5  # other than the defaults, so that --eps and --out-eps are seen to arrive
OUT_EPS = 1e-4


def report(ok, name, detail):
    one_case.record(name, [] if ok else [detail], detail)


def rows(t, d, rnd):
    """t rows of d values, each row scaled by 10^U(-1,1) (100x apart)."""
    out = []
    for _ in range(t):
        mag = 10 ** rng.uniform(-1, 1)
        out.append([rnd(mag * rng.gauss(0, 1)) for _ in range(d)])
    return out


def vec(d, mean=0.0, spread=1.0):
    return [reference.round_f32(mean + spread * rng.gauss(0, 1)) for _ in range(d)]


def run(op, args):
    db = ["--db", DB] if DB else []
    return subprocess.run([CLI, "run", "--op", op, "--device", "cpu"] + db + args, capture_output=True, text=True)


def write(path, shape, data):
    npyio.write_f32(path, shape, flat(data))


def grad_error(got, want):
    """got's error against the reference: relative, or absolute where the
    reference is exactly zero."""
    want = flat(want)
    return rel_err(got, want) if any(want) else (max(abs(x) for x in got) if got else 0.0)


class Case:
    """One problem's input files, its command, and its reference gradients
    (want: output flag's name without dashes -> nested lists)."""

    def path(self, name):
        return os.path.join(self.tmp, name)

    def outputs(self):
        return [g for g in self.files if self.want.get(g) is not None]

    def read(self, grad):
        return npyio.read_f32(self.path(self.files[grad]))

    def check(self, res, tol_of):
        """(ok, detail) of a run against want; tol_of(grad) is its tolerance."""
        if res.returncode != 0:
            return False, "exit %d: %s" % (res.returncode, res.stderr.strip()[-300:])
        ok, errs = True, []
        for grad in self.outputs():
            shape, got = self.read(grad)
            err = grad_error(got, self.want[grad])
            errs.append("%s %.1e" % (grad, err))
            if math.prod(shape) != len(flat(self.want[grad])) or not err <= tol_of(grad):
                ok = False
        return ok, ", ".join(errs)


class Phase1Case(Case):
    def __init__(self, tmp, dtype, n, s, t, d, heads, gains, dlse, scale=1.0, want=True):
        rnd = reference.ROUND[dtype]
        self.tmp, self.dtype = tmp, dtype
        p = self.path
        self.sources = [rows(t, d, rnd) for _ in range(n)]
        self.queries = [vec(d, 0.0, 3 / math.sqrt(d)) for _ in range(s)]
        self.gains = [vec(d, 1.0, 0.2) for _ in range(s)] if gains else None
        self.do1 = [rows(t, d, rnd) for _ in range(s)]
        self.dlse = [[vec(heads) for _ in range(t)] for _ in range(s)] if dlse else None
        write(p("s.npy"), (n, t, d), self.sources)
        write(p("q.npy"), (s, d), self.queries)
        write(p("do1.npy"), (s, t, d), self.do1)
        self.files = {"dsources": "out_ds.npy", "dqueries": "out_dq.npy", "dgains": "out_dg.npy"}
        self.args = ["--dtype", dtype, "--heads", str(heads), "--eps", repr(EPS), "--scale", repr(scale),
                     "--sources", p("s.npy"), "--queries", p("q.npy"), "--do1", p("do1.npy"),
                     "--dsources", p("out_ds.npy"), "--dqueries", p("out_dq.npy")]
        if gains:
            write(p("gs.npy"), (s, d), self.gains)
            self.args += ["--gains", p("gs.npy"), "--dgains", p("out_dg.npy")]
        if dlse:
            write(p("dlse.npy"), (s, t, heads), self.dlse)
            self.args += ["--dlse", p("dlse.npy")]
        self.want = reference.phase1_backward(self.sources, self.queries, self.do1, self.dlse, self.gains, heads,
                                              EPS, scale) if want else {}

    def run(self, extra=()):
        return run("phase1_backward", self.args + list(extra))


class Phase2Case(Case):
    def __init__(self, tmp, dtype, t, d, heads, gain, fuse, epilogue, dout=True, scale=1.0, want=True):
        rnd = reference.ROUND[dtype]
        self.tmp, self.dtype = tmp, dtype
        p = self.path
        self.o1 = rows(t, d, rnd)
        self.lse = [[reference.round_f32(rng.gauss(0, 2) + math.log(5)) for _ in range(heads)] for _ in range(t)]
        self.b = rows(t, d, rnd)
        self.query = vec(d, 0.0, 3 / math.sqrt(d))
        self.gain = vec(d, 1.0, 0.2) if gain else None
        self.dout = rows(t, d, rnd) if dout else None
        self.out_gain = vec(d, 1.0, 0.25) if epilogue else None
        self.dnormed = rows(t, d, rnd) if epilogue else None
        write(p("o1.npy"), (t, d), self.o1)
        write(p("lse.npy"), (t, heads), self.lse)
        write(p("b.npy"), (t, d), self.b)
        write(p("w.npy"), (d,), self.query)
        self.files = {"do1": "out_do1.npy", "dlse": "out_dlse.npy", "db": "out_db.npy", "dsublayer": "out_df.npy",
                      "dquery": "out_dw.npy", "dgain": "out_dg2.npy", "dout_gain": "out_dgo.npy"}
        self.args = ["--dtype", dtype, "--eps", repr(EPS), "--scale", repr(scale), "--o1", p("o1.npy"),
                     "--lse", p("lse.npy"), "--partial", p("b.npy"), "--query", p("w.npy"),
                     "--do1", p("out_do1.npy"), "--dlse", p("out_dlse.npy"), "--dpartial", p("out_db.npy"),
                     "--dquery", p("out_dw.npy")]
        if gain:
            write(p("g.npy"), (d,), self.gain)
            self.args += ["--gain", p("g.npy"), "--dgain", p("out_dg2.npy")]
        if fuse:
            self.args += ["--fuse-add", "--dsublayer", p("out_df.npy")]
        if dout:
            write(p("dout.npy"), (t, d), self.dout)
            self.args += ["--dout", p("dout.npy")]
        if epilogue:
            write(p("go.npy"), (d,), self.out_gain)
            write(p("dn.npy"), (t, d), self.dnormed)
            self.args += ["--out-gain", p("go.npy"), "--dnormed", p("dn.npy"), "--out-eps", repr(OUT_EPS),
                          "--dout-gain", p("out_dgo.npy")]
        self.want = reference.phase2_backward(self.o1, self.lse, self.b, self.query, self.dout, self.gain, heads,
                                              EPS, scale, self.out_gain, self.dnormed, OUT_EPS,
                                              fuse) if want else {}

    def run(self, extra=()):
        return run("phase2_backward", self.args + list(extra))


# ---- the references against finite differences ---------------------------

def max_fd_error(loss, args, got, h=1e-6):
    """The largest |central difference - got| over every element of every
    argument named in got (a dict: index of args -> the nested gradient)."""
    worst = 0.0

    def bumped(x, path, delta):
        if not path:
            return x + delta
        return [bumped(v, path[1:], delta) if i == path[0] else v for i, v in enumerate(x)]

    def paths(x, prefix=()):
        if isinstance(x, list):
            for i, v in enumerate(x):
                yield from paths(v, prefix + (i,))
        else:
            yield prefix

    for which, grad in got.items():
        for path in paths(args[which]):
            plus, minus = list(args), list(args)
            plus[which] = bumped(args[which], path, h)
            minus[which] = bumped(args[which], path, -h)
            fd = (loss(*plus) - loss(*minus)) / (2 * h)
            g = grad
            for i in path:
                g = g[i]
            worst = max(worst, abs(fd - g))
    return worst


def dot(a, b):
    return sum(x * y for x, y in zip(flat(a), flat(b)))


if one_case.wanted("phase1_reference_matches_finite_differences"):
    # The loss reads o1 and lse: sum(o1 * do1) + sum(lse * dlse).
    n, s, t, d, heads, scale = 3, 2, 2, 8, 2, 1.3
    src = [[[rng.gauss(0, 1) * (1 + i) for _ in range(d)] for _ in range(t)] for i in range(n)]
    qs = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(s)]
    gs = [[1 + 0.3 * rng.gauss(0, 1) for _ in range(d)] for _ in range(s)]
    do1 = [[[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)] for _ in range(s)]
    dlse = [[[rng.gauss(0, 1) for _ in range(heads)] for _ in range(t)] for _ in range(s)]

    def loss(src_, qs_, gs_):
        o1, lse = reference.phase1(src_, qs_, gs_, heads, 1e-6, scale)
        return dot(o1, do1) + dot(lse, dlse)

    got = reference.phase1_backward(src, qs, do1, dlse, gs, heads, 1e-6, scale)
    worst = max_fd_error(loss, [src, qs, gs], {0: got["dsources"], 1: got["dqueries"], 2: got["dgains"]})
    # Without dlse: the loss reads o1 alone.
    got0 = reference.phase1_backward(src, qs, do1, None, gs, heads, 1e-6, scale)
    worst0 = max_fd_error(lambda a, b, c: dot(reference.phase1(a, b, c, heads, 1e-6, scale)[0], do1), [src, qs, gs],
                          {0: got0["dsources"], 1: got0["dqueries"]})
    report(max(worst, worst0) < 1e-6, "phase1_reference_matches_finite_differences",
           "worst abs diff %.1e, %.1e without dlse" % (worst, worst0))

if one_case.wanted("phase2_reference_matches_finite_differences"):
    # The loss reads out and normed: sum(out * dout) + sum(normed * dnormed),
    # with the fused add's b = partial + sublayer given as b (the forward
    # without its add), whose gradient is that of both.
    t, d, heads, scale, eps_o = 2, 8, 2, 1.3, 1e-3
    o1 = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]
    lse = [[rng.gauss(0, 1) for _ in range(heads)] for _ in range(t)]
    b = [[rng.gauss(0, 1) * 2 for _ in range(d)] for _ in range(t)]
    w = [rng.gauss(0, 1) for _ in range(d)]
    g = [1 + 0.3 * rng.gauss(0, 1) for _ in range(d)]
    go = [1 + 0.3 * rng.gauss(0, 1) for _ in range(d)]
    dout = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]
    dn = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]

    def loss(o1_, lse_, b_, w_, g_, go_):
        out, normed, _ = reference.phase2(o1_, lse_, b_, w_, g_, heads, 1e-6, scale, None, go_, eps_o)
        return dot(out, dout) + dot(normed, dn)

    got = reference.phase2_backward(o1, lse, b, w, dout, g, heads, 1e-6, scale, go, dn, eps_o, True)
    worst = max_fd_error(loss, [o1, lse, b, w, g, go], {0: got["do1"], 1: got["dlse"], 2: got["db"],
                                                        3: got["dquery"], 4: got["dgain"], 5: got["dout_gain"]})
    same = got["dsublayer"] == got["db"]
    # Without the epilogue, and through the fused add's sublayer.
    part = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]
    sub = [[bk - pk for bk, pk in zip(br, pr)] for br, pr in zip(b, part)]

    def loss_fused(sub_):
        out, _, _ = reference.phase2(o1, lse, part, w, g, heads, 1e-6, scale, sub_)
        return dot(out, dout)

    got2 = reference.phase2_backward(o1, lse, b, w, dout, g, heads, 1e-6, scale, fuse_add=True)
    worst2 = max_fd_error(loss_fused, [sub], {0: got2["dsublayer"]})
    report(max(worst, worst2) < 1e-6 and same, "phase2_reference_matches_finite_differences",
           "worst abs diff %.1e, %.1e through the sublayer%s" % (worst, worst2, "" if same else "; dsublayer != db"))

# ---- against the reference -------------------------------------------------

PHASE1_CASES = [
    # name, dtype, n, S, T, d, H, gains, --dlse, scale
    ("phase1_f32_h1_gains", "f32", 3, 2, 5, 64, 1, True, False, 1.0),
    ("phase1_f32_h2_gains_dlse", "f32", 3, 3, 40, 64, 2, True, True, 0.8),
    ("phase1_f32_n1_dlse", "f32", 1, 2, 4, 32, 1, False, True, 1.0),
    ("phase1_f32_n1_no_dlse", "f32", 1, 2, 4, 32, 2, True, False, 1.0),
    ("phase1_f32_s1_h2_dlse", "f32", 2, 1, 6, 64, 2, False, True, 1.0),
    ("phase1_bf16_h2_dlse", "bf16", 3, 2, 6, 64, 2, False, True, 1.0),
    ("phase1_bf16_h1_gains_no_dlse", "bf16", 3, 3, 7, 64, 1, True, False, 1.0),
    ("phase1_f16_h2_gains_dlse", "f16", 2, 2, 6, 64, 2, True, True, 1.0),
]
for name, dtype, n, s, t, d, heads, gains, dlse, scale in PHASE1_CASES:
    if not one_case.wanted(name):
        continue
    with tempfile.TemporaryDirectory() as tmp:
        c = Phase1Case(tmp, dtype, n, s, t, d, heads, gains, dlse, scale)
        tol = 1e-5 if dtype == "f32" else 1e-2
        ok, detail = c.check(c.run(), lambda grad: tol)
        report(ok, name, detail)

PHASE2_CASES = [
    # name, dtype, T, d, H, gain, --fuse-add, epilogue, --dout, scale
    ("phase2_f32_h1_gain", "f32", 5, 64, 1, True, False, False, True, 1.0),
    ("phase2_f32_h2_fused", "f32", 40, 64, 2, False, True, False, True, 0.8),
    ("phase2_f32_epilogue_dout", "f32", 6, 64, 2, True, False, True, True, 1.0),
    ("phase2_f32_epilogue_no_dout_fused", "f32", 7, 32, 1, True, True, True, False, 1.0),
    ("phase2_f32_epilogue_fused_h2", "f32", 40, 64, 2, False, True, True, True, 1.0),
    ("phase2_bf16_h2_gain", "bf16", 6, 64, 2, True, False, False, True, 1.0),
    ("phase2_bf16_fused_epilogue_dout", "bf16", 6, 64, 2, True, True, True, True, 1.0),
    ("phase2_bf16_epilogue_no_dout", "bf16", 5, 64, 1, False, False, True, False, 1.0),
    ("phase2_f16_fused_h2", "f16", 6, 64, 2, True, True, False, True, 1.0),
]
for name, dtype, t, d, heads, gain, fuse, epilogue, dout, scale in PHASE2_CASES:
    if not one_case.wanted(name):
        continue
    with tempfile.TemporaryDirectory() as tmp:
        c = Phase2Case(tmp, dtype, t, d, heads, gain, fuse, epilogue, dout, scale)
        tol = 1e-5 if dtype == "f32" else 1e-2
        # --heads is optional (lse's width); given here where it is 2.
        ok, detail = c.check(c.run(["--heads", "2"] if heads == 2 else []), lambda grad: tol)
        report(ok, name, detail)

# ---- fp32 source gradients ---------------------------------------------------

if one_case.wanted("phase1_bf16_dsources_f32"):
    with tempfile.TemporaryDirectory() as tmp:
        # --dsources-f32: DS written in fp32, never rounded to bf16, meets
        # fp32's tolerance; the query gradients keep bf16's.
        c = Phase1Case(tmp, "bf16", 3, 2, 40, 64, 2, True, True)
        ok, detail = c.check(c.run(["--dsources-f32"]), lambda grad: 1e-5 if grad == "dsources" else 1e-2)
        refused = run("phase2_backward", ["--dsources-f32"] + Phase2Case(tmp, "f32", 2, 8, 1, False, False, False,
                                                                         want=False).args)
        ok = ok and refused.returncode == 2 and "--dsources-f32" in refused.stderr
        report(ok, "phase1_bf16_dsources_f32", detail)

# ---- the chain against the mix backward --------------------------------------

if one_case.wanted("chain_equals_mix_backward"):
    # phase1 -> phase2 (forward), then phase2_backward -> phase1_backward, all
    # through the command line: the gradients of the n block sources, of b
    # and of the site's W and G equal those of the mix over the n + 1
    # sources with b last (DESIGN 1: the two-phase form is that mix).
    n, t, d, heads = 3, 6, 64, 2
    src = [rows(t, d, reference.round_f32) for _ in range(n)]
    b = rows(t, d, reference.round_f32)
    w, g = vec(d, 0.0, 3 / math.sqrt(d)), vec(d, 1.0, 0.2)
    dout = rows(t, d, reference.round_f32)
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda f: os.path.join(tmp, f)  # noqa: E731
        write(p("s.npy"), (n, t, d), src)
        write(p("b.npy"), (t, d), b)
        write(p("q.npy"), (1, d), [w])
        write(p("gs.npy"), (1, d), [g])
        write(p("w.npy"), (d,), w)
        write(p("g.npy"), (d,), g)
        write(p("dout.npy"), (t, d), dout)
        common = ["--heads", str(heads), "--eps", repr(EPS)]
        steps = [("phase1", ["--sources", p("s.npy"), "--queries", p("q.npy"), "--gains", p("gs.npy"),
                             "--out", p("o1_s.npy"), "--lse", p("lse_s.npy")]),
                 # phase 2 takes one site's (T, d) and (T, H): the same data.
                 ("phase2_backward", ["--o1", p("o1.npy"), "--lse", p("lse.npy"), "--partial", p("b.npy"),
                                      "--query", p("w.npy"), "--gain", p("g.npy"), "--dout", p("dout.npy"),
                                      "--do1", p("do1.npy"), "--dlse", p("dlse.npy"), "--dpartial", p("db.npy"),
                                      "--dquery", p("dw2.npy"), "--dgain", p("dg2.npy")]),
                 ("phase1_backward", ["--sources", p("s.npy"), "--queries", p("q.npy"), "--gains", p("gs.npy"),
                                      "--do1", p("do1_s.npy"), "--dlse", p("dlse_s.npy"), "--dsources", p("ds.npy"),
                                      "--dqueries", p("dw1.npy"), "--dgains", p("dg1.npy")])]
        why = ""
        for op, args in steps:
            if op == "phase2_backward":
                for a, shape in (("o1", (t, d)), ("lse", (t, heads))):
                    npyio.write_f32(p(a + ".npy"), shape, npyio.read_f32(p(a + "_s.npy"))[1])
            if op == "phase1_backward":
                for a, shape in (("do1", (1, t, d)), ("dlse", (1, t, heads))):
                    npyio.write_f32(p(a + "_s.npy"), shape, npyio.read_f32(p(a + ".npy"))[1])
            res = run(op, common + args)
            if res.returncode != 0:
                why = "%s: exit %d: %s" % (op, res.returncode, res.stderr.strip()[-300:])
                break
        if not why:
            want = reference.mix_backward(src + [b], w, dout, g, heads, EPS)
            got = {"dsources": npyio.read_f32(p("ds.npy"))[1] + npyio.read_f32(p("db.npy"))[1],
                   "dquery": [x + y for x, y in zip(npyio.read_f32(p("dw1.npy"))[1], npyio.read_f32(p("dw2.npy"))[1])],
                   "dgain": [x + y for x, y in zip(npyio.read_f32(p("dg1.npy"))[1], npyio.read_f32(p("dg2.npy"))[1])]}
            errs = {k: grad_error(v, want[k]) for k, v in got.items()}
            why = ", ".join("%s %.1e" % kv for kv in errs.items())
            report(reference.worst(errs.values()) <= 1e-5, "chain_equals_mix_backward", why)
        else:
            report(False, "chain_equals_mix_backward", why)

# ---- T = 0 -------------------------------------------------------------------

if one_case.wanted("zero_tokens_write_zero_sums"):
    with tempfile.TemporaryDirectory() as tmp:
        c1 = Phase1Case(tmp, "f32", 2, 3, 0, 16, 2, True, True)
        r1 = c1.run()
        c2 = Phase2Case(tmp, "bf16", 0, 16, 2, True, True, True)
        r2 = c2.run()
        ok, why = r1.returncode == 0 and r2.returncode == 0, (r1.stderr + r2.stderr).strip()[-300:]
        if ok:
            shapes = {g: c1.read(g) for g in c1.outputs()}
            shapes.update({"p2 " + g: c2.read(g) for g in c2.outputs()})
            want = {"dsources": (2, 0, 16), "dqueries": (3, 16), "dgains": (3, 16), "p2 do1": (0, 16),
                    "p2 dlse": (0, 2), "p2 db": (0, 16), "p2 dsublayer": (0, 16), "p2 dquery": (16,),
                    "p2 dgain": (16,), "p2 dout_gain": (16,)}
            bad = [k for k in want if k not in shapes or shapes[k][0] != want[k] or any(shapes[k][1])]
            ok, why = not bad, "wrong: " + ", ".join(bad) if bad else "%d files, sums zero" % len(shapes)
        report(ok, "zero_tokens_write_zero_sums", why)

# ---- determinism -----------------------------------------------------------

if one_case.wanted("two_runs_byte_identical"):
    with tempfile.TemporaryDirectory() as tmp:
        # 70 tokens: three token groups, so the sums over tokens take the
        # second pass that adds the groups' partial sums.
        cases = [Phase1Case(tmp, "bf16", 4, 3, 70, 128, 2, True, True, want=False),
                 Phase2Case(tmp, "bf16", 70, 128, 2, True, True, True, want=False)]
        differ, why, count = [], "", 0
        for c in cases:
            first = None
            for _ in range(2):
                res = c.run()
                if res.returncode != 0:
                    why = res.stderr.strip()[-300:]
                    break
                store = {}
                for g, f in c.files.items():
                    if os.path.exists(c.path(f)):
                        with open(c.path(f), "rb") as fh:
                            store[g] = fh.read()
                        os.unlink(c.path(f))
                if first is None:
                    first = store
                elif store != first or not store:
                    differ += [g for g in set(store) | set(first) if store.get(g) != first.get(g)]
                count += len(store)
        ok = not why and not differ
        report(ok, "two_runs_byte_identical", why or ("differ: " + ", ".join(differ) if differ else
                                                      "%d files" % count))

# ---- all or none -----------------------------------------------------------

if one_case.wanted("outputs_all_or_none"):
    with tempfile.TemporaryDirectory() as tmp:
        # The last output's path is a directory: the run fails after the
        # launch, and none of the six others is left behind.
        c = Phase2Case(tmp, "f32", 4, 16, 1, True, True, True, want=False)
        os.mkdir(c.path("out_dgo.npy"))
        res = c.run()
        left = [f for f in os.listdir(tmp) if f.startswith("out_") and f != "out_dgo.npy"]
        c1 = Phase1Case(tmp, "f32", 2, 2, 3, 16, 1, True, False, want=False)
        os.mkdir(c1.path("out_dg.npy"))
        res1 = c1.run()
        left += [f for f in os.listdir(tmp) if f.startswith("out_") and f not in ("out_dgo.npy", "out_dg.npy")]
        ok = res.returncode == 1 and res1.returncode == 1 and not left and all(
            "not a regular file" in r.stderr and "no output was written" in r.stderr for r in (res, res1))
        report(ok, "outputs_all_or_none", "exit %d, %d, left %s: %s" % (res.returncode, res1.returncode, left,
                                                                        res.stderr.strip()[-160:]))

# ---- bad input -------------------------------------------------------------

def snapshot(tmp):
    out = {}
    for f in sorted(os.listdir(tmp)):
        with open(os.path.join(tmp, f), "rb") as fh:
            out[f] = fh.read()
    return out


def refusals(name, tmp, op, bad):
    """Runs each (what, args, needle): each must fail, say needle, and leave
    every file of tmp as it was (no output, no input replaced)."""
    problems = []
    before = snapshot(tmp)
    for what, args, needle in bad:
        res = run(op, args)
        after = snapshot(tmp)
        changed = sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f))
        if res.returncode == 0 or needle not in res.stderr or changed:
            problems.append("%s: exit %d, %r, changed %s" % (what, res.returncode, res.stderr.strip()[:160],
                                                              changed))
    report(not problems, name, "; ".join(problems) if problems else "%d refusals, each with its reason" % len(bad))


if one_case.wanted("phase1_bad_input_refused_without_output"):
    with tempfile.TemporaryDirectory() as tmp:
        c = Phase1Case(tmp, "f32", 2, 2, 3, 16, 2, True, True, want=False)
        p = c.path
        write(p("do1_short.npy"), (2, 2, 16), [0.5] * 64)
        write(p("dlse_h1.npy"), (2, 3, 1), [0.5] * 6)
        write(p("q_narrow.npy"), (2, 8), [0.5] * 16)
        write(p("q_many.npy"), (65, 16), [0.01] * (65 * 16))
        write(p("do1_many.npy"), (65, 3, 16), [0.5] * (65 * 48))
        base = ["--sources", p("s.npy"), "--queries", p("q.npy"), "--heads", "2"]
        outs = ["--dsources", p("out_ds.npy")]
        bad = [
            ("no --do1", base + outs, "--do1"),
            ("no --queries", ["--sources", p("s.npy"), "--do1", p("do1.npy")] + outs, "--queries"),
            ("no gradient output", base + ["--do1", p("do1.npy")], "at least one gradient"),
            ("--do1 of the wrong shape", base + ["--do1", p("do1_short.npy")] + outs, "--do1"),
            ("--dlse of the wrong width", base + ["--do1", p("do1.npy"), "--dlse", p("dlse_h1.npy")] + outs, "--dlse"),
            ("--queries of the wrong width", ["--sources", p("s.npy"), "--queries", p("q_narrow.npy"), "--do1",
                                              p("do1.npy")] + outs, "--queries"),
            ("65 sites (the CPU's backward takes 64)", ["--sources", p("s.npy"), "--queries", p("q_many.npy"),
                                                        "--do1", p("do1_many.npy")] + outs, "64"),
            ("--dgains without --gains", base + ["--do1", p("do1.npy"), "--dgains", p("out_dg.npy")], "--gains"),
            ("--out-eps", base + ["--do1", p("do1.npy"), "--out-eps", "1e-5"] + outs, "--out-eps"),
            ("--lse (phase 1's output)", base + ["--do1", p("do1.npy"), "--lse", p("out_l.npy")] + outs, "--lse"),
            ("--fuse-add", base + ["--do1", p("do1.npy"), "--fuse-add"] + outs, "--fuse-add"),
            ("--dquery (phase 2's)", base + ["--do1", p("do1.npy"), "--dquery", p("out_dw.npy")], "--dquery"),
            ("--alpha", base + ["--do1", p("do1.npy"), "--alpha", "0.5"] + outs, "--alpha"),
            ("an output at an input's path", base + ["--do1", p("do1.npy"), "--dqueries", p("q.npy")],
             "would be replaced"),
            ("an output at --do1's path", base + ["--do1", p("do1.npy"), "--dsources", p("do1.npy")],
             "would be replaced"),
            ("an output at --dlse's path", base + ["--do1", p("do1.npy"), "--dlse", p("dlse.npy"), "--dqueries",
                                                   p("dlse.npy")], "would be replaced"),
            ("two outputs at one path", base + ["--do1", p("do1.npy"), "--dsources", p("out_x.npy"), "--dqueries",
                                                p("out_x.npy")], "same file"),
            ("--heads not dividing d", ["--sources", p("s.npy"), "--queries", p("q.npy"), "--do1", p("do1.npy"),
                                        "--heads", "3"] + outs, "divide"),
            ("--heads out of range", ["--sources", p("s.npy"), "--queries", p("q.npy"), "--do1", p("do1.npy"),
                                      "--heads", "4294967297"] + outs, "--heads"),
            ("--eps zero", base + ["--do1", p("do1.npy"), "--eps", "0"] + outs, "--eps"),
            ("--scale not finite", base + ["--do1", p("do1.npy"), "--scale", "inf"] + outs, "--scale"),
            ("a missing input", base + ["--do1", p("nothing.npy")] + outs, "nothing.npy"),
        ]
        refusals("phase1_bad_input_refused_without_output", tmp, "phase1_backward", bad)

if one_case.wanted("phase2_bad_input_refused_without_output"):
    with tempfile.TemporaryDirectory() as tmp:
        c = Phase2Case(tmp, "f32", 3, 16, 2, True, False, False, want=False)
        p = c.path
        write(p("t_short.npy"), (2, 16), [0.5] * 32)
        write(p("lse_short.npy"), (2, 2), [0.5] * 4)
        write(p("lse_h3.npy"), (3, 3), [0.5] * 9)
        write(p("go.npy"), (16,), [1.0] * 16)
        write(p("dn.npy"), (3, 16), [0.5] * 48)
        ins = ["--o1", p("o1.npy"), "--lse", p("lse.npy"), "--partial", p("b.npy"), "--query", p("w.npy")]
        base = ins + ["--dout", p("dout.npy")]
        outs = ["--dquery", p("out_dw.npy")]
        epi = ["--out-gain", p("go.npy"), "--dnormed", p("dn.npy")]
        bad = [
            ("no --o1", ins[2:] + ["--dout", p("dout.npy")] + outs, "--o1"),
            ("no --partial", ins[:4] + ins[6:] + ["--dout", p("dout.npy")] + outs, "--partial"),
            ("no --dout and no epilogue", ins + outs, "--dout"),
            ("no gradient output", base, "at least one gradient"),
            ("--dsublayer without --fuse-add", base + ["--dsublayer", p("out_df.npy")], "--fuse-add"),
            ("--dgain without --gain", base + ["--dgain", p("out_dg2.npy")], "--gain"),
            ("--out-gain without --dnormed", base + ["--out-gain", p("go.npy")] + outs, "--dnormed"),
            ("--dnormed without --out-gain", base + ["--dnormed", p("dn.npy")] + outs, "give --out-gain"),
            ("--dout-gain without --out-gain", base + ["--dout-gain", p("out_dgo.npy")], "give --out-gain"),
            ("--out-eps without --out-gain", base + ["--out-eps", "1e-5"] + outs, "give --out-gain"),
            ("--out (recomputed)", base + epi + ["--out", p("o1.npy")] + outs, "--out is not used"),
            ("--normed", base + epi + ["--normed", p("out_n.npy")] + outs, "--normed is not used"),
            ("--sublayer (the forward's)", base + ["--sublayer", p("b.npy")] + outs, "--sublayer"),
            ("--dsources (phase 1's)", base + ["--dsources", p("out_ds.npy")], "--dsources"),
            ("--dsources-f32", base + ["--dsources-f32"] + outs, "--dsources-f32"),
            ("--alpha", base + ["--alpha", "0.5"] + outs, "--alpha"),
            ("--lse of the wrong T", ins[:2] + ["--lse", p("lse_short.npy")] + ins[4:] + ["--dout", p("dout.npy")]
             + outs, "--lse"),
            ("--lse's H not dividing d", ins[:2] + ["--lse", p("lse_h3.npy")] + ins[4:] +
             ["--dout", p("dout.npy")] + outs, "divide"),
            ("--heads not matching --lse", base + ["--heads", "1"] + outs, "--heads"),
            ("--heads out of range", base + ["--heads", "0"] + outs, "--heads"),
            ("--dout of the wrong shape", ins + ["--dout", p("t_short.npy")] + outs, "--dout"),
            ("--dnormed of the wrong shape", base + ["--out-gain", p("go.npy"), "--dnormed", p("t_short.npy")] + outs,
             "--dnormed"),
            ("--out-gain of the wrong length", base + ["--out-gain", p("b.npy"), "--dnormed", p("dn.npy")] + outs,
             "--out-gain"),
            ("--out-eps zero", base + epi + ["--out-eps", "0"] + outs, "--out-eps"),
            ("--out-eps beyond float32", base + epi + ["--out-eps", "1e300"] + outs, "--out-eps"),
            ("--eps not a number", base + ["--eps", "nan"] + outs, "--eps"),
            ("an output at an input's path", base + ["--dlse", p("lse.npy")], "would be replaced"),
            ("an output at the epilogue's input", base + epi + ["--dout-gain", p("go.npy")], "would be replaced"),
            ("two outputs at one path", base + ["--do1", p("out_x.npy"), "--dpartial", p("out_x.npy")], "same file"),
            ("--op misspelt", base + outs + ["--op", "phase2_backwards"], "--op"),
        ]
        refusals("phase2_bad_input_refused_without_output", tmp, "phase2_backward", bad)

one_case.finish()
