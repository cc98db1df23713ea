"""`attnres run --op mix_backward` (the gradients of the mix, DESIGN.md 1b)
against the independent fp64 reference (reference.mix_backward), on fresh
random inputs whose rows differ in magnitude by 100x: fp32 within 1e-5
relative, bf16 and f16 within 1e-2 of the reference computed from the rounded
inputs, per gradient, in both forms, with H = 1 and 2, N = 1 and 3.

Also: the reference itself against central differences of reference.mix (so
the oracle is checked, not trusted); two runs give byte-identical output
files; `attnres plan --op mix_backward --explain` names the op and its kernel;
and bad input is refused with a message and no output file.

Arguments: the attnres binary, and optionally a database of tuned winners."""

import math
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from compare import dalpha_err, flat, rel_err  # noqa: E402
import npyio  # noqa: E402
import one_case  # noqa: E402
import reference  # noqa: E402

one_case.take_args(1)
CLI = sys.argv[1]
DB = sys.argv[2] if len(sys.argv) > 2 else None
rng = random.Random()
GRADS = ("dsources", "dquery", "dgain", "dpartial", "dalpha")


def report(ok, name, detail):
    one_case.record(name, [] if ok else [detail], detail)


def rows(t, d, rnd):
    """t rows of d values, each row scaled by 10^U(-1,1) (100x apart)."""
    out = []
    for _ in range(t):
        mag = 10 ** rng.uniform(-1, 1)
        out.append([rnd(mag * rng.gauss(0, 1)) for _ in range(d)])
    return out


def run(args):
    return subprocess.run([CLI, "run", "--op", "mix_backward", "--device", "cpu"] + args, capture_output=True,
                          text=True)


class Case:
    """One problem's input files, its reference gradients and its command."""

    def __init__(self, tmp, dtype, n, t, d, heads, additive, gain):
        rnd = reference.ROUND[dtype]
        self.dtype = dtype
        self.sources = [rows(t, d, rnd) for _ in range(n)]
        self.query = [reference.round_f32(rng.gauss(0, 1) * 2 / math.sqrt(d)) for _ in range(d)]
        self.gain = [reference.round_f32(1 + 0.25 * rng.gauss(0, 1)) for _ in range(d)] if gain else None
        self.partial = rows(t, d, rnd) if additive else None
        self.dout = rows(t, d, rnd)
        self.alpha = 0.75
        p = lambda f: os.path.join(tmp, f)  # noqa: E731
        self.path = p
        npyio.write_f32(p("s.npy"), (n, t, d), flat(self.sources))
        npyio.write_f32(p("w.npy"), (d,), self.query)
        npyio.write_f32(p("do.npy"), (t, d), flat(self.dout))
        self.args = ["--dtype", dtype, "--heads", str(heads), "--sources", p("s.npy"), "--query", p("w.npy"),
                     "--dout", p("do.npy"), "--dsources", p("dsources.npy"), "--dquery", p("dquery.npy")]
        if gain:
            npyio.write_f32(p("g.npy"), (d,), self.gain)
            self.args += ["--gain", p("g.npy"), "--dgain", p("dgain.npy")]
        if additive:
            npyio.write_f32(p("p.npy"), (t, d), flat(self.partial))
            self.args += ["--partial", p("p.npy"), "--alpha", str(self.alpha), "--dpartial", p("dpartial.npy"),
                          "--dalpha", p("dalpha.npy")]
        if DB:
            self.args += ["--db", DB]
        # The scores use the query as the kernel does: folded in fp32.
        self.want = reference.mix_backward(self.sources, self.query, self.dout, self.gain, heads, 1e-6, 1.0,
                                           self.partial, self.alpha if additive else 1.0)

    def outputs(self):
        return [g for g in GRADS if self.want[g] is not None]

    def read(self, grad):
        return npyio.read_f32(self.path(grad + ".npy"))

    def error(self, grad, got):
        """got's error against the reference (dalpha's against the size of its terms)."""
        want = flat(self.want[grad])
        if grad == "dalpha":
            return dalpha_err(got, want, self.sources, self.dout)
        # dquery is exactly zero with one source (DESIGN 1b, N = 1).
        return rel_err(got, want) if any(want) else max(abs(x) for x in got)


# ---- the reference against finite differences ----------------------------

if one_case.wanted("reference_matches_finite_differences"):
    n, t, d, heads = 3, 2, 8, 2
    src = [[[rng.gauss(0, 1) * (1 + i) for _ in range(d)] for _ in range(t)] for i in range(n)]
    w = [rng.gauss(0, 1) for _ in range(d)]
    g = [1 + 0.3 * rng.gauss(0, 1) for _ in range(d)]
    part = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]
    dout = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]

    def loss(src_, w_, g_, alpha_):
        out, _ = reference.mix(src_, w_, g_, heads, 1e-6, 1.3, part, alpha_)
        return sum(out[i][k] * dout[i][k] for i in range(t) for k in range(d))

    got = reference.mix_backward(src, w, dout, g, heads, 1e-6, 1.3, part, 0.6)
    h, worst = 1e-6, 0.0

    def nudged(x, idx, delta):
        y = [list(v) if isinstance(v, list) else v for v in x]
        y[idx] += delta
        return y

    for i in range(n):
        for tok in range(t):
            for k in range(d):
                plus = [[list(r) for r in s] for s in src]
                minus = [[list(r) for r in s] for s in src]
                plus[i][tok][k] += h
                minus[i][tok][k] -= h
                fd = (loss(plus, w, g, 0.6) - loss(minus, w, g, 0.6)) / (2 * h)
                worst = max(worst, abs(fd - got["dsources"][i][tok][k]))
    for k in range(d):
        fd = (loss(src, nudged(w, k, h), g, 0.6) - loss(src, nudged(w, k, -h), g, 0.6)) / (2 * h)
        worst = max(worst, abs(fd - got["dquery"][k]))
        fd = (loss(src, w, nudged(g, k, h), 0.6) - loss(src, w, nudged(g, k, -h), 0.6)) / (2 * h)
        worst = max(worst, abs(fd - got["dgain"][k]))
    fd = (loss(src, w, g, 0.6 + h) - loss(src, w, g, 0.6 - h)) / (2 * h)
    worst = max(worst, abs(fd - got["dalpha"]))
    dp = got["dpartial"]
    worst = max(worst, max(abs(dp[i][k] - dout[i][k]) for i in range(t) for k in range(d)))
    report(worst < 1e-6, "reference_matches_finite_differences", "worst abs diff %.1e" % worst)

# ---- against the reference -------------------------------------------------

CASES = [
    # name, dtype, N, T, d, H, additive, gain
    ("f32_replace_h1", "f32", 3, 5, 64, 1, False, False),
    ("f32_additive_h2_gain", "f32", 3, 40, 64, 2, True, True),
    ("f32_n1", "f32", 1, 4, 32, 1, False, True),
    ("bf16_additive_h2", "bf16", 3, 6, 64, 2, True, False),
    ("f16_replace_h2_gain", "f16", 2, 6, 64, 2, False, True),
]
for name, dtype, n, t, d, heads, additive, gain in CASES:
    if not one_case.wanted(name):
        continue
    with tempfile.TemporaryDirectory() as tmp:
        c = Case(tmp, dtype, n, t, d, heads, additive, gain)
        res = run(c.args)
        if res.returncode != 0:
            report(False, name, "exit %d: %s" % (res.returncode, res.stderr.strip()[-300:]))
            continue
        tol = 1e-5 if dtype == "f32" else 1e-2
        errs, shapes_ok = [], True
        for grad in c.outputs():
            shape, got = c.read(grad)
            shapes_ok = shapes_ok and math.prod(shape) == len(flat(c.want[grad]))
            err = c.error(grad, got)
            errs.append("%s %.1e" % (grad, err))
            if not err <= tol:
                shapes_ok = False
        report(shapes_ok, name, ", ".join(errs))

# ---- fp32 source gradients ---------------------------------------------------

if one_case.wanted("bf16_dsources_f32"):
    with tempfile.TemporaryDirectory() as tmp:
        # --dsources-f32: the kernel writes DS in fp32, never rounded to bf16,
        # so DS meets fp32's tolerance against the reference of the rounded
        # inputs; the other gradients keep bf16's.
        c = Case(tmp, "bf16", 3, 40, 64, 2, True, False)
        res = run(c.args + ["--dsources-f32"])
        ok, errs = res.returncode == 0, []
        if not ok:
            errs.append("exit %d: %s" % (res.returncode, res.stderr.strip()[-300:]))
        for grad in c.outputs() if ok else []:
            shape, got = c.read(grad)
            err = c.error(grad, got)
            errs.append("%s %.1e" % (grad, err))
            ok = ok and err <= (1e-5 if grad == "dsources" else 1e-2)
        refused = subprocess.run([CLI, "run", "--op", "mix", "--device", "cpu", "--sources", c.path("s.npy"),
                                  "--query", c.path("w.npy"), "--out", c.path("o.npy"), "--dsources-f32"],
                                 capture_output=True, text=True)
        ok = ok and refused.returncode != 0 and "--dsources-f32" in refused.stderr
        report(ok, "bf16_dsources_f32", ", ".join(errs))

# ---- determinism -----------------------------------------------------------

if one_case.wanted("two_runs_byte_identical"):
    with tempfile.TemporaryDirectory() as tmp:
        # 70 tokens: three token groups, so the sums over tokens take the
        # second pass that adds the groups' partial sums.
        c = Case(tmp, "bf16", 4, 70, 128, 2, True, True)
        first, second, ok, why = {}, {}, True, ""
        for store in (first, second):
            res = run(c.args)
            if res.returncode != 0:
                ok, why = False, res.stderr.strip()[-300:]
                break
            for grad in c.outputs():
                with open(c.path(grad + ".npy"), "rb") as f:
                    store[grad] = f.read()
                os.unlink(c.path(grad + ".npy"))
        if ok:
            differ = [g for g in c.outputs() if first.get(g) != second.get(g)]
            ok, why = not differ, "differ: " + ", ".join(differ) if differ else "%d files" % len(first)
        report(ok, "two_runs_byte_identical", why)

# ---- plan --op mix_backward ------------------------------------------------

if one_case.wanted("plan_explains_mix_backward"):
    res = subprocess.run([CLI, "plan", "--device", "cpu", "--op", "mix_backward", "--dtype", "f32", "--d", "64",
                          "--n", "3", "--heads", "2", "--additive", "--explain"], capture_output=True, text=True)
    out = res.stdout
    ok = res.returncode == 0 and "problem: mix_backward f32 d=64 N=3 H=2 additive" in out and "mix_backward" in \
        out.split("using the built-in generic kernel", 1)[-1] and "bytes for up to 4096 tokens" in out
    report(ok, "plan_explains_mix_backward", (out + res.stderr).strip().replace("\n", " | ")[:200])
    res = subprocess.run([CLI, "plan", "--device", "cpu", "--op", "mix_backward", "--dtype", "f32", "--d", "64",
                          "--n", "3", "--epilogue"], capture_output=True, text=True)
    report(res.returncode == 0 and "+epilogue" in res.stdout, "plan_takes_mix_backward_epilogue",
           (res.stdout + res.stderr).strip()[:160])
    res = subprocess.run([CLI, "plan", "--device", "cpu", "--op", "mix_backward", "--dtype", "f32", "--d", "64",
                          "--n", "3", "--tokens", "0"], capture_output=True, text=True)
    report(res.returncode == 2 and "--tokens" in res.stderr, "plan_refuses_tokens_out_of_range",
           res.stderr.strip()[:160])
    res = subprocess.run([CLI, "plan", "--op", "mix_backwards", "--dtype", "f32", "--d", "64", "--n", "3"],
                         capture_output=True, text=True)
    report(res.returncode == 2 and "mix_backward" in res.stderr, "plan_refuses_unknown_op",
           res.stderr.strip()[:160])

# ---- bad input -------------------------------------------------------------

if one_case.wanted("bad_input_refused_without_output"):
    with tempfile.TemporaryDirectory() as tmp:
        c = Case(tmp, "f32", 2, 3, 16, 1, False, False)
        p = c.path
        npyio.write_f32(p("do_short.npy"), (2, 16), [0.5] * 32)
        npyio.write_f32(p("p.npy"), (3, 16), [0.0] * 48)
        base = ["--sources", p("s.npy"), "--query", p("w.npy")]
        bad = [
            ("no --dout", base + ["--dsources", p("dsources.npy")], "--dout"),
            ("no gradient output", base + ["--dout", p("do.npy")], "at least one gradient"),
            ("--dout of the wrong shape", base + ["--dout", p("do_short.npy"), "--dsources", p("dsources.npy")],
             "--dout"),
            ("--dpartial without --partial", base + ["--dout", p("do.npy"), "--dpartial", p("dpartial.npy")],
             "--partial"),
            ("--dgain without --gain", base + ["--dout", p("do.npy"), "--dgain", p("dgain.npy")], "--gain"),
            ("--out of the forward", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"), "--out",
                                             p("out.npy")], "--out is not used"),
            ("the epilogue", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"), "--out-gain",
                                     p("w.npy"), "--normed", p("n.npy")], "not used"),
            ("two outputs at one path", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"),
                                                "--dquery", p("dsources.npy")], "same file"),
            ("--heads not dividing d", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"), "--heads",
                                               "3"], "divide"),
            ("--heads out of range", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"), "--heads",
                                             "4294967297"], "--heads"),
            ("--dalpha without --partial", base + ["--dout", p("do.npy"), "--dalpha", p("dalpha.npy")],
             "--partial"),
        ]
        problems = []
        for what, args, needle in bad:
            res = run(args)
            left = [f for f in os.listdir(tmp) if f.startswith("d") and f != "do.npy" and f != "do_short.npy"]
            if res.returncode == 0 or needle not in res.stderr or left:
                problems.append("%s: exit %d, %r, left %s" % (what, res.returncode, res.stderr.strip()[:120], left))
        report(not problems, "bad_input_refused_without_output",
               "; ".join(problems) if problems else "%d refusals, each with its reason" % len(bad))

one_case.finish()
