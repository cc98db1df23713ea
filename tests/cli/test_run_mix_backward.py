"""`attnres run --op mix_backward` (the gradients of the mix, DESIGN.md 1b)
against the independent fp64 reference (reference.mix_backward), on fresh
random inputs whose rows differ in magnitude by 100x: fp32 within 1e-5
relative, bf16 and f16 within 1e-2 of the reference computed from the rounded
inputs, per gradient, in both forms, with H = 1 and 2, N = 1 and 3; and the
output-norm epilogue's backward (--out-gain, --out, --dnormed, --dout-gain),
from the reference forward's out, with and without --dout.

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
GRADS = ("dsources", "dquery", "dgain", "dpartial", "dalpha", "dout_gain")
OUT_EPS = 1e-5  # the epilogue's, other than the default so that --out-eps is seen to arrive


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

    def __init__(self, tmp, dtype, n, t, d, heads, additive, gain, epilogue=False, dout=True):
        rnd = reference.ROUND[dtype]
        self.dtype = dtype
        self.sources = [rows(t, d, rnd) for _ in range(n)]
        self.query = [reference.round_f32(rng.gauss(0, 1) * 2 / math.sqrt(d)) for _ in range(d)]
        self.gain = [reference.round_f32(1 + 0.25 * rng.gauss(0, 1)) for _ in range(d)] if gain else None
        self.partial = rows(t, d, rnd) if additive else None
        self.dout = rows(t, d, rnd) if dout else None
        self.alpha = 0.75
        p = lambda f: os.path.join(tmp, f)  # noqa: E731
        self.path = p
        npyio.write_f32(p("s.npy"), (n, t, d), flat(self.sources))
        npyio.write_f32(p("w.npy"), (d,), self.query)
        self.args = ["--dtype", dtype, "--heads", str(heads), "--sources", p("s.npy"), "--query", p("w.npy"),
                     "--dsources", p("dsources.npy"), "--dquery", p("dquery.npy")]
        if dout:
            npyio.write_f32(p("do.npy"), (t, d), flat(self.dout))
            self.args += ["--dout", p("do.npy")]
        if gain:
            npyio.write_f32(p("g.npy"), (d,), self.gain)
            self.args += ["--gain", p("g.npy"), "--dgain", p("dgain.npy")]
        if additive:
            npyio.write_f32(p("p.npy"), (t, d), flat(self.partial))
            self.args += ["--partial", p("p.npy"), "--alpha", str(self.alpha), "--dpartial", p("dpartial.npy"),
                          "--dalpha", p("dalpha.npy")]
        self.out = self.out_gain = self.dnormed = None
        # The gradient that reaches out, all of it: dalpha's error is held
        # to the size of its terms.
        self.grad_out = self.dout
        if epilogue:
            # The forward's out as the reference forward gives it, rounded
            # to the storage type as the command rounds the file.
            self.out_gain = [reference.round_f32(1 + 0.25 * rng.gauss(0, 1)) for _ in range(d)]
            out, _ = reference.mix(self.sources, self.query, self.gain, heads, 1e-6, 1.0, self.partial,
                                   self.alpha if additive else 1.0)
            self.out = [[rnd(x) for x in row] for row in out]
            self.dnormed = rows(t, d, rnd)
            npyio.write_f32(p("go.npy"), (d,), self.out_gain)
            npyio.write_f32(p("out.npy"), (t, d), flat(self.out))
            npyio.write_f32(p("dn.npy"), (t, d), flat(self.dnormed))
            self.args += ["--out-gain", p("go.npy"), "--out", p("out.npy"), "--dnormed", p("dn.npy"),
                          "--out-eps", repr(OUT_EPS), "--dout-gain", p("dout_gain.npy")]
            self.grad_out, _ = reference.rmsnorm_backward(self.out, self.dnormed, self.out_gain, OUT_EPS,
                                                          self.dout)
        if DB:
            self.args += ["--db", DB]
        # The scores use the query as the kernel does: folded in fp32.
        self.want = reference.mix_backward(self.sources, self.query, self.dout, self.gain, heads, 1e-6, 1.0,
                                           self.partial, self.alpha if additive else 1.0, out=self.out,
                                           out_gain=self.out_gain, dnormed=self.dnormed, out_eps=OUT_EPS)

    def outputs(self):
        return [g for g in GRADS if self.want[g] is not None]

    def read(self, grad):
        return npyio.read_f32(self.path(grad + ".npy"))

    def error(self, grad, got):
        """got's error against the reference (dalpha's against the size of its terms)."""
        want = flat(self.want[grad])
        if grad == "dalpha":
            return dalpha_err(got, want, self.sources, self.grad_out)
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

if one_case.wanted("reference_epilogue_matches_finite_differences"):
    # The loss reads out and normed: sum(out * dout) + sum(normed * dnormed),
    # and the backward is given the forward's out as the forward computed it.
    n, t, d, heads, eps_o = 3, 2, 8, 2, 1e-3
    src = [[[rng.gauss(0, 1) * (1 + i) for _ in range(d)] for _ in range(t)] for i in range(n)]
    w = [rng.gauss(0, 1) for _ in range(d)]
    g = [1 + 0.3 * rng.gauss(0, 1) for _ in range(d)]
    go = [1 + 0.3 * rng.gauss(0, 1) for _ in range(d)]
    part = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]
    dout = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]
    dn = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(t)]

    def loss(src_, w_, g_, alpha_, go_, part_):
        out, normed = reference.mix(src_, w_, g_, heads, 1e-6, 1.3, part_, alpha_, go_, eps_o)
        return sum(out[i][k] * dout[i][k] + normed[i][k] * dn[i][k] for i in range(t) for k in range(d))

    out, _ = reference.mix(src, w, g, heads, 1e-6, 1.3, part, 0.6, go, eps_o)
    got = reference.mix_backward(src, w, dout, g, heads, 1e-6, 1.3, part, 0.6, out=out, out_gain=go,
                                 dnormed=dn, out_eps=eps_o)
    h, worst = 1e-6, 0.0
    args = [src, w, g, 0.6, go, part]

    def fd(which, bump):
        """The central difference of the loss along bump(x, delta), which
        returns a copy of argument which nudged."""
        plus, minus = list(args), list(args)
        plus[which] = bump(args[which], h)
        minus[which] = bump(args[which], -h)
        return (loss(*plus) - loss(*minus)) / (2 * h)

    def vec(k):
        return lambda x, delta: [v + (delta if j == k else 0.0) for j, v in enumerate(x)]

    def mat(tok, k):
        return lambda x, delta: [[v + (delta if (i, j) == (tok, k) else 0.0) for j, v in enumerate(r)]
                                 for i, r in enumerate(x)]

    for i in range(n):
        for tok in range(t):
            for k in range(d):
                bump = (lambda i_, m: lambda x, delta: [m(s_, delta) if j == i_ else s_
                                                        for j, s_ in enumerate(x)])(i, mat(tok, k))
                worst = max(worst, abs(fd(0, bump) - got["dsources"][i][tok][k]))
    for k in range(d):
        worst = max(worst, abs(fd(1, vec(k)) - got["dquery"][k]))
        worst = max(worst, abs(fd(2, vec(k)) - got["dgain"][k]))
        worst = max(worst, abs(fd(4, vec(k)) - got["dout_gain"][k]))
    worst = max(worst, abs(fd(3, lambda x, delta: x + delta) - got["dalpha"]))
    for tok in range(t):
        for k in range(d):
            worst = max(worst, abs(fd(5, mat(tok, k)) - got["dpartial"][tok][k]))
    report(worst < 1e-6, "reference_epilogue_matches_finite_differences", "worst abs diff %.1e" % worst)

# ---- against the reference -------------------------------------------------

CASES = [
    # name, dtype, N, T, d, H, additive, gain
    ("f32_replace_h1", "f32", 3, 5, 64, 1, False, False),
    ("f32_additive_h2_gain", "f32", 3, 40, 64, 2, True, True),
    ("f32_n1", "f32", 1, 4, 32, 1, False, True),
    ("bf16_additive_h2", "bf16", 3, 6, 64, 2, True, False),
    ("f16_replace_h2_gain", "f16", 2, 6, 64, 2, False, True),
]
# The output-norm epilogue's backward, from the reference forward's out:
# dout given (added to the norm's gradient) or not (the loss reads normed
# alone).
EPILOGUE_CASES = [
    # name, dtype, N, T, d, H, additive, gain, --dout
    ("f32_epilogue_replace_dout", "f32", 3, 5, 64, 1, False, True, True),
    ("f32_epilogue_replace_no_dout", "f32", 2, 6, 32, 2, False, False, False),
    ("f32_epilogue_additive_dout", "f32", 3, 40, 64, 2, True, True, True),
    ("f32_epilogue_additive_no_dout", "f32", 3, 7, 64, 1, True, False, False),
    ("bf16_epilogue_replace_dout", "bf16", 3, 6, 64, 2, False, True, True),
    ("bf16_epilogue_replace_no_dout", "bf16", 2, 5, 64, 1, False, False, False),
    ("bf16_epilogue_additive_dout", "bf16", 3, 40, 64, 2, True, False, True),
    ("bf16_epilogue_additive_no_dout", "bf16", 3, 6, 64, 2, True, True, False),
    ("f16_epilogue_additive_dout", "f16", 2, 6, 64, 2, True, True, True),
]
ALL_CASES = [c + (False, True) for c in CASES] + [c[:8] + (True, c[8]) for c in EPILOGUE_CASES]
for name, dtype, n, t, d, heads, additive, gain, epilogue, dout in ALL_CASES:
    if not one_case.wanted(name):
        continue
    with tempfile.TemporaryDirectory() as tmp:
        c = Case(tmp, dtype, n, t, d, heads, additive, gain, epilogue, dout)
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

if one_case.wanted("epilogue_two_runs_byte_identical"):
    with tempfile.TemporaryDirectory() as tmp:
        # The same with the epilogue (whose gradient of out_gain is summed
        # over the groups too), and a third run without --dout-gain (the
        # runtime then gets no dout_gain) that writes the others unchanged.
        c = Case(tmp, "bf16", 4, 70, 128, 2, True, True, True, True)
        at = c.args.index("--dout-gain")
        without = c.args[:at] + c.args[at + 2:]
        runs, ok, why = [], True, ""
        for args in (c.args, c.args, without):
            res = run(args)
            if res.returncode != 0:
                ok, why = False, res.stderr.strip()[-300:]
                break
            store = {}
            for grad in c.outputs():
                if os.path.exists(c.path(grad + ".npy")):
                    with open(c.path(grad + ".npy"), "rb") as f:
                        store[grad] = f.read()
                    os.unlink(c.path(grad + ".npy"))
            runs.append(store)
        if ok:
            first, second, third = runs
            differ = [g for g in c.outputs() if first.get(g) != second.get(g)]
            differ += ["%s without --dout-gain" % g for g in c.outputs()
                       if g != "dout_gain" and third.get(g) != first.get(g)]
            if "dout_gain" in third or "dout_gain" not in first:
                differ.append("dout_gain written only with --dout-gain")
            ok, why = not differ, "differ: " + ", ".join(differ) if differ else "%d files" % len(first)
        report(ok, "epilogue_two_runs_byte_identical", why)

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
        # The epilogue's inputs (named so that no input starts with "d").
        npyio.write_f32(p("go.npy"), (16,), [1.0] * 16)
        npyio.write_f32(p("o.npy"), (3, 16), [0.25] * 48)
        npyio.write_f32(p("ndn.npy"), (3, 16), [0.5] * 48)
        base = ["--sources", p("s.npy"), "--query", p("w.npy")]
        epi = ["--out-gain", p("go.npy"), "--out", p("o.npy"), "--dnormed", p("ndn.npy"), "--dsources",
               p("dsources.npy"), "--dout-gain", p("dout_gain.npy")]
        bad = [
            ("no --dout", base + ["--dsources", p("dsources.npy")], "--dout"),
            ("no gradient output", base + ["--dout", p("do.npy")], "at least one gradient"),
            ("--dout of the wrong shape", base + ["--dout", p("do_short.npy"), "--dsources", p("dsources.npy")],
             "--dout"),
            ("--dpartial without --partial", base + ["--dout", p("do.npy"), "--dpartial", p("dpartial.npy")],
             "--partial"),
            ("--dgain without --gain", base + ["--dout", p("do.npy"), "--dgain", p("dgain.npy")], "--gain"),
            ("--out without --out-gain", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"), "--out",
                                                 p("o.npy")], "give --out-gain"),
            ("--dnormed without --out-gain", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"),
                                                     "--dnormed", p("ndn.npy")], "give --out-gain"),
            ("--dout-gain without --out-gain", base + ["--dout", p("do.npy"), "--dout-gain",
                                                       p("dout_gain.npy")], "give --out-gain"),
            ("--out-eps without --out-gain", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"),
                                                     "--out-eps", "1e-5"], "give --out-gain"),
            ("--out-gain without --out", base + ["--dsources", p("dsources.npy"), "--out-gain", p("go.npy"),
                                                 "--dnormed", p("ndn.npy")], "also needs --out"),
            ("--out-gain without --dnormed", base + ["--dout", p("do.npy"), "--dsources", p("dsources.npy"),
                                                     "--out-gain", p("go.npy"), "--out", p("o.npy")],
             "--dnormed"),
            ("--normed given to the backward", base + ["--dout", p("do.npy")] + epi + ["--normed", p("n.npy")],
             "--normed is not used by --op mix_backward"),
            ("--out of the wrong shape", base + epi[:3] + [p("do_short.npy")] + epi[4:], "--out"),
            ("--dnormed of the wrong shape", base + epi[:5] + [p("do_short.npy")] + epi[6:], "--dnormed"),
            ("--out-gain of the wrong length", base + ["--out-gain", p("do.npy")] + epi[2:], "--out-gain"),
            ("--out-eps zero", base + epi + ["--out-eps", "0"], "--out-eps"),
            ("--out-eps beyond float32", base + epi + ["--out-eps", "1e300"], "--out-eps"),
            ("--out-eps not a number", base + epi + ["--out-eps", "tiny"], "--out-eps"),
            ("an output at an input's path", base + epi + ["--dquery", p("go.npy")], "would be replaced"),
            ("the epilogue with no gradient output", base + epi[:6], "at least one gradient"),
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
