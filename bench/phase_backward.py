"""Block AttnRes' two phases and their backwards on the CPU against PyTorch,
in one run: K3's block (bf16, d = 7168, n = 8 completed blocks, S = 24
sites, H = 1, eps = 1e-5) and an MHAR-8B-like block (bf16, d = 4096, H = 8,
the same n and S, eps = 1e-6), phase 2 with the fused add, T = 4096 by
default.

Step 1, the tuned kernels. `attnres tune --device cpu --problems FILE`
(bench/phase_backward_problems.txt: phase1_backward, phase2_backward and
the forward phase1 and phase2 of both shapes at the T bucket 4096) tunes
into --tune-db (default build/bench-data/phase-backward-DATE-TIME.db, a
fresh database: a problem decided from measurements on record has no paired
figure), and the winners table it prints is shown. Its `paired` column is
each winner's time as a fraction of a streaming pass, timed beside it, that
moves the bytes of the tuner's traffic model (tuner/src/problems.c); phase
1 and its backward are bound by arithmetic (O(n S d) a token), so for them
the `% FMA` column (the tuner's flop model over the device's FMA peak)
says more. --db DB skips the tune and plans from DB ('builtin': the
built-in kernels).

The tune's arguments are kept small because K3's phase 1 backward takes
seconds a launch at T = 4096 (its screening, full and final rounds time
every candidate a few times each): --strategy halving --budget 2 (the best
two of the screening timed again), --retries 0 (a final round that other
work disturbed is not timed again, and its winner is marked provisional;
on a shared host nearly every round is, and each retry repeats the longest
part of the tune; the paired fraction, timed in the same rounds as the
winner, is the figure to read there), --time-limit 180 (the tuner's 60 s a
candidate would cut a final round of 16 launches of a few seconds each).

Step 2, the times, per shape, interleaved round by round (each round runs
every case once in the same order; phase 2's cases, which take a few
milliseconds, --p2-calls times each, interleaved), after checking that the
outputs and gradients of every path agree with eager PyTorch (relative
norm error within 1e-2, each output and gradient apart):
  attnres kernel bwd   Plan.phase1_backward (every site's do1 and dlse
                       given) and Plan.phase2_backward (with the fused
                       add's dsublayer) into preallocated gradients: the C
                       kernel and the Python call, what an engine runs
  attnres kernel fwd   Plan.phase1 and Plan.phase2 (the fused add: partial,
                       copied back before each call outside the timer, is
                       updated in place) into preallocated outputs
  attnres autograd     torch.ops.attnres.phase1 (sources as n leaf
                       tensors), or torch.ops.attnres.phase2 on a copy of
                       the partial-sum leaf (made before the timer: a
                       partial sum in a model is no leaf), then
                       torch.autograd.grad of its outputs (the registered
                       backwards: torch.ops.attnres.phase1_backward and
                       .phase2_backward, gradients allocated by torch)
  eager                the same for a plain PyTorch implementation of the
                       two phases of DESIGN section 1 (fp32 arithmetic on
                       the bf16 storage, as bench/python_overhead.py's
                       torch_mix; phase 1's per-head dots and its mix as
                       einsums, sources as one (n, T, d) leaf; phase 2 does
                       the fused add out of place and returns the new
                       partial sum beside out), run eagerly
  compile              those functions through torch.compile (inductor,
                       fullgraph, static shapes)
The autograd rows time forward and backward of one call apart (bwd: the
torch.autograd.grad call alone; f+b: both). Reported: the median over the
rounds (wall clock, and the process's CPU time for f+b), the ratios
PyTorch / attnres for the backward and for forward + backward, each phase
apart and for a whole block as phase 1 + (S - 1) x phase 2 (a block's first
site has no phase 2), summed from the medians (derived, not timed), and the
kernels' rates: GB/s of the tuner's traffic model, and for phase 1 GFLOP/s
of its flop model.

Phase 1's backward takes dlse for every site (as if each had a phase 2);
phase 2's inputs o1 and lse are the phase 1 kernel's for the last site, so
its sigmoid sees lse values of the shape's own scores.

torch allocates every output (attnres.torch's gradients included) with
malloc; attnres.torch asks for transparent huge pages on its large outputs,
torch itself only with THP_MEM_ALLOC_ENABLE=1 (the header says whether it
is set). At T = 4096 K3's phase 1 holds S = 24 rows of o1 and of do1 (1.4
GB each in bf16, twice that in eager PyTorch's fp32): the run of
bench/results/phase-backward-2026-12-07.md peaked at 12.5 GiB resident, and
took 32 minutes on a loaded 2-vCPU guest, 14 of them the tune.

Before the tune and before timing each shape the script waits (up to
--wait-max seconds each time) for the 1-minute load average to drop below
--wait-load, and prints the load before and after each shape.

Usage (in a venv with torch and the package; see bench/README.md):
  python bench/phase_backward.py [--attnres build/bin/attnres]
      [--tune-db NEWFILE | --db FILE] [--strategy halving] [--budget 2]
      [--retries 0] [--time-limit 180] [--t 4096] [--rounds 5] [--p2-calls 5]
      [--shapes K3,MHAR-8B] [--torch-threads N] [--wait-load 1.5]
      [--wait-max 180]
"""

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

import torch

import attnres

# The load-average helpers of the mix backward's benchmark (this script's
# folder is first on sys.path when it runs).
from backward import load, wait_for_load

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name: (d, n, S, H, eps)
SHAPES = {"K3": (7168, 8, 24, 1, 1e-5), "MHAR-8B": (4096, 8, 24, 8, 1e-6)}
PHASES = ("phase 1", "phase 2")
CASES = ("kernel bwd", "kernel fwd", "attnres", "eager", "compile")


# ---- the host -------------------------------------------------------------------


def lscpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def host_line():
    info = lscpu()
    flags = set(info.get("Flags", "").split())
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if f in flags]
    model = info.get("Model name") or platform.processor() or "unknown"
    virt = f", {info['Hypervisor vendor']} guest" if "Hypervisor vendor" in info else ""
    return (f"{model} (family {info.get('CPU family', '?')} model {info.get('Model', '?')}{virt}), "
            f"{os.cpu_count()} CPUs; flags: {' '.join(isa) or 'no AVX2'}"
            f"{'' if 'avx512f' in flags else ' (no AVX-512)'}")


def commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return head + (" (working tree modified)" if dirty else "")


# ---- step 1: the tune ----------------------------------------------------------


def tune(args):
    os.makedirs(os.path.dirname(os.path.abspath(args.tune_db)), exist_ok=True)
    cmd = [args.attnres, "tune", "--device", "cpu", "--problems", args.problems, "--db", args.tune_db,
           "--strategy", args.strategy, "--jobs", "1"]
    if args.budget:
        cmd += ["--budget", args.budget]
    if args.retries is not None:
        cmd += ["--retries", str(args.retries)]
    if args.time_limit:
        cmd += ["--time-limit", str(args.time_limit)]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True)
    # The tuner's progress goes to stderr: its per-problem summaries and
    # anything that went wrong first, then its report (the winners table).
    for line in res.stderr.splitlines():
        if (re.match(r"\[\d+/\d+\]", line) or " not ok" in line or "provisional" in line or "timeout" in line
                or "error" in line.lower()):
            print(line)
    sys.stdout.write(res.stdout)
    print(f"(tune: exit {res.returncode}, {time.monotonic() - t0:.0f} s)", flush=True)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit("the tune failed")
    return args.tune_db


# ---- the two phases in plain PyTorch ----------------------------------------------


def torch_phase1(sources, queries, heads: int, eps: float):
    """DESIGN section 1's phase 1 in plain PyTorch, fp32 arithmetic on the
    storage type: the n sources (n, T, d) against the S folded queries
    (S, d). Returns o1 (S, T, d) in the storage type and lse (S, T, H)
    float32."""
    v = sources.float()
    n, t, d = v.shape
    sites, dh = queries.shape[0], d // heads
    r = torch.rsqrt(v.pow(2).mean(-1) + eps)                                   # (n, T)
    vh = v.view(n, t, heads, dh)
    s = torch.einsum("nthk,shk->ntsh", vh, queries.view(sites, heads, dh)) * r[:, :, None, None]
    lse = torch.logsumexp(s, dim=0)                                             # (T, S, H)
    a = torch.exp(s - lse)                                                      # the weights, (n, T, S, H)
    o1 = torch.einsum("ntsh,nthk->sthk", a, vh)                                 # (S, T, H, dh)
    # Rounded before the reshape, which copies: the copy moves 2-byte values.
    return o1.to(sources.dtype).reshape(sites, t, d), lse.permute(1, 0, 2)


def torch_phase2(o1, lse, partial, sublayer, query, heads: int, eps: float):
    """Phase 2 of one site in plain PyTorch, with the fused add: b = partial
    + sublayer (rounded to the storage type, as the op stores it), then
    out = o1 + p2 (b - o1), p2 = sigmoid(s2 - lse) per head. Returns out
    and b (the new partial sum, which the block's later sites read)."""
    b = (partial.float() + sublayer.float()).to(partial.dtype)
    x = b.float()
    t, d = x.shape
    dh = d // heads
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    s2 = (r * x * query).view(t, heads, dh).sum(-1)                             # (T, H)
    p2 = torch.sigmoid(s2 - lse).unsqueeze(-1)
    o = o1.float().view(t, heads, dh)
    out = (o + p2 * (x.view(t, heads, dh) - o)).view(t, d)
    return out.to(o1.dtype), b


# ---- step 2: the times ------------------------------------------------------------


def rel_err(got, want):
    """||got - want|| / ||want||, a row of the first dimension at a time
    (K3's o1 is 0.7 G values at T = 4096), in float32 (exact differences of
    bf16 values; the norms' rounding is far below the 1e-2 checked) with
    the rows' squares summed in float64. got may be a list of rows (one
    gradient per source)."""
    rows = got if isinstance(got, (list, tuple)) else got.unbind(0) if got.dim() > 1 else [got]
    want_rows = want.unbind(0) if want.dim() > 1 else [want]
    num = den = 0.0
    for g, w in zip(rows, want_rows):
        g, w = g.detach().float(), w.detach().float()
        num += float(torch.linalg.vector_norm(g - w)) ** 2
        den += float(torch.linalg.vector_norm(w)) ** 2
    return (num / (den or 1.0)) ** 0.5


def winner(plan, t):
    """The variant the plan runs at T = t (its smallest tuned bucket >= t,
    from Plan.explain), or the plan's level where it names none."""
    buckets = sorted((int(b), v) for b, v in re.findall(r"T bucket (\d+): (\S+)", plan.explain()))
    if not buckets:
        return plan.level
    return next((v for b, v in buckets if b >= t), buckets[-1][1])


class Phase:
    """One phase's cases at one shape: the kernel calls (each with a setup
    run outside the timer), the three autograd paths (each returns its
    (fwd, bwd) seconds, its outputs and its gradients), the byte and flop
    models of its two kernels, and its plans."""

    def __init__(self, name, kernels, paths, labels, traffic, plans):
        self.name, self.kernels, self.paths, self.labels = name, kernels, paths, labels
        self.traffic, self.plans = traffic, plans

    def kernel_outputs(self):
        setup, call, outputs = self.kernels["kernel fwd"]
        setup()
        call()
        setup, call, grads = self.kernels["kernel bwd"]
        setup()
        call()
        return outputs, grads

    def check(self):
        """Every path's outputs and gradients against eager PyTorch's
        (relative norm errors), one path at a time, so that only eager's
        results and one other path's are alive at once. The compile's first
        call (which compiles forward and backward) is timed."""
        steps = []
        t0 = time.perf_counter()
        _, outs_e, grads_e = self.paths["eager"]()
        want = list(outs_e) + list(grads_e)
        del outs_e, grads_e
        steps.append(("eager", time.perf_counter() - t0))
        errs = {}
        for label, run in (("attnres autograd", lambda: self.paths["attnres"]()[1:]),
                           ("attnres kernel", self.kernel_outputs),
                           ("compile", lambda: self.paths["compile"]()[1:])):
            t0 = time.perf_counter()
            outs, grads = run()
            t1 = time.perf_counter()
            errs[label] = [rel_err(g, w) for g, w in zip(list(outs) + list(grads), want)]
            del outs, grads
            steps.append((label, t1 - t0))
            steps.append(("its errors", time.perf_counter() - t1))
        return errs, steps

    def run(self, case):
        """(bwd, CPU, f+b) seconds of one call of case: a kernel's bwd and
        f+b are its wall time; CPU is the process's CPU time of the call."""
        if case in self.kernels:
            setup, call, _ = self.kernels[case]
            setup()
            c0, w0 = time.process_time(), time.perf_counter()
            call()
            w1, c1 = time.perf_counter(), time.process_time()
            return (w1 - w0, c1 - c0, w1 - w0)
        c0 = time.process_time()
        (fwd, bwd), *_ = self.paths[case]()
        return (bwd, time.process_time() - c0, fwd + bwd)


def nothing():
    pass


def phase1(name, t, compiled, gen):
    import attnres.torch as art

    d, n, sites, heads, eps = SHAPES[name]
    src = torch.randn(n, t, d, generator=gen).bfloat16()
    qs = torch.randn(sites, d, generator=gen) / d ** 0.5
    do1 = torch.randn(sites, t, d, generator=gen).bfloat16()
    dlse = torch.randn(sites, t, heads, generator=gen)
    rows = list(src.unbind(0))
    cap = torch.utils.dlpack.to_dlpack

    plan_b = art.plan_for(src, op="phase1_backward", dtype="bf16", d=d, n=n, heads=heads, sites=sites)
    plan_f = art.plan_for(src, op="phase1", dtype="bf16", d=d, n=n, heads=heads, sites=sites)
    dsrc_k = torch.empty(n, t, d, dtype=torch.bfloat16)
    dq_k = torch.empty(sites, d, dtype=torch.float32)
    o1_k = torch.empty(sites, t, d, dtype=torch.bfloat16)
    lse_k = torch.empty(sites, t, heads, dtype=torch.float32)

    def kernel_bwd():
        plan_b.phase1_backward([cap(r) for r in rows], cap(qs), cap(do1), cap(dlse), eps=eps,
                               dsources=cap(dsrc_k), dqueries=cap(dq_k))

    def kernel_fwd():
        plan_f.phase1([cap(r) for r in rows], cap(qs), eps=eps, out=cap(o1_k), lse=cap(lse_k))

    op = torch.ops.attnres.phase1

    def ours():
        leaves = [r.detach().requires_grad_() for r in rows]
        uq = qs.detach().requires_grad_()
        t0 = time.perf_counter()
        o1, lse = op(leaves, uq, heads, eps, 1.0)
        t1 = time.perf_counter()
        grads = torch.autograd.grad([o1, lse], leaves + [uq], [do1, dlse])
        t2 = time.perf_counter()
        return (t1 - t0, t2 - t1), (o1, lse), (grads[:-1], grads[-1])

    def plain(fn):
        def run():
            s = src.detach().requires_grad_()
            uq = qs.detach().requires_grad_()
            t0 = time.perf_counter()
            o1, lse = fn(s, uq, heads, eps)
            t1 = time.perf_counter()
            grads = torch.autograd.grad([o1, lse], [s, uq], [do1, dlse])
            t2 = time.perf_counter()
            return (t1 - t0, t2 - t1), (o1, lse), grads
        return run

    kernels = {"kernel bwd": (nothing, kernel_bwd, (dsrc_k, dq_k)),
               "kernel fwd": (nothing, kernel_fwd, (o1_k, lse_k))}
    paths = {"attnres": ours, "eager": plain(torch_phase1), "compile": plain(compiled["phase1"])}
    traffic = {  # the tuner's models (tuner/src/problems.c): bytes read + written, flop
        "bwd bytes": (n + sites) * t * d * 2 + sites * t * heads * 4 + n * t * d * 2,
        "fwd bytes": n * t * d * 2 + sites * (t * d * 2 + t * heads * 4),
        "bwd flop": n * t * d * (3.0 + 10.0 * sites),
        "fwd flop": n * t * d * (2.0 + 4.0 * sites),
    }
    plans = {"bwd": (plan_b.level, winner(plan_b, t)), "fwd": (plan_f.level, winner(plan_f, t))}
    ph = Phase("phase 1", kernels, paths, ("o1", "lse", "dsources", "dqueries"), traffic, plans)
    # phase 2's o1 and lse: the last site's, from the phase 1 kernel
    kernel_fwd()
    return ph, (o1_k[-1].clone(), lse_k[-1].clone())


def phase2(name, t, compiled, gen, o1, lse):
    import attnres.torch as art

    d, n, sites, heads, eps = SHAPES[name]
    q = torch.randn(d, generator=gen) / d ** 0.5
    partial = torch.randn(t, d, generator=gen).bfloat16()
    sub = torch.randn(t, d, generator=gen).bfloat16()
    dout = torch.randn(t, d, generator=gen).bfloat16()
    cap = torch.utils.dlpack.to_dlpack

    plan_b = art.plan_for(o1, op="phase2_backward", dtype="bf16", d=d, heads=heads, fuse_add=True, epilogue=False)
    plan_f = art.plan_for(o1, op="phase2", dtype="bf16", d=d, heads=heads, fuse_add=True, epilogue=False)
    b_k = partial.clone()  # the kernel forward's partial sum, which it updates in place
    out_k = torch.empty(t, d, dtype=torch.bfloat16)
    do1_k, dp_k, dsub_k = (torch.empty(t, d, dtype=torch.bfloat16) for _ in range(3))
    dlse_k = torch.empty(t, heads, dtype=torch.float32)
    dq_k = torch.empty(d, dtype=torch.float32)

    def reset_partial():
        b_k.copy_(partial)

    def kernel_fwd():
        plan_f.phase2(cap(o1), cap(lse), cap(b_k), cap(q), sublayer=cap(sub), eps=eps, out=cap(out_k))

    def kernel_bwd():  # b_k: the partial sum after the fused add, as the forward left it
        plan_b.phase2_backward(cap(o1), cap(lse), cap(b_k), cap(q), cap(dout), eps=eps, do1=cap(do1_k),
                               dlse=cap(dlse_k), dpartial=cap(dp_k), dsublayer=cap(dsub_k), dquery=cap(dq_k))

    op = torch.ops.attnres.phase2

    def leaves():
        return [x.detach().requires_grad_() for x in (o1, lse, partial, sub, q)]

    def ours():
        lo1, llse, lp, lsub, lq = leaves()
        b = lp.clone()  # a partial sum the fused add may write (in a model it is no leaf)
        t0 = time.perf_counter()
        out, _ = op(lo1, llse, b, lq, lsub, None, eps, 1.0, 1e-6)
        t1 = time.perf_counter()
        grads = torch.autograd.grad(out, [lo1, llse, lp, lsub, lq], dout)
        t2 = time.perf_counter()
        return (t1 - t0, t2 - t1), (out,), grads

    def plain(fn):
        def run():
            lo1, llse, lp, lsub, lq = leaves()
            t0 = time.perf_counter()
            out, _ = fn(lo1, llse, lp, lsub, lq, heads, eps)
            t1 = time.perf_counter()
            grads = torch.autograd.grad(out, [lo1, llse, lp, lsub, lq], dout)
            t2 = time.perf_counter()
            return (t1 - t0, t2 - t1), (out,), grads
        return run

    kernels = {"kernel bwd": (nothing, kernel_bwd, (do1_k, dlse_k, dp_k, dsub_k, dq_k)),
               "kernel fwd": (reset_partial, kernel_fwd, (out_k,))}
    paths = {"attnres": ours, "eager": plain(torch_phase2), "compile": plain(compiled["phase2"])}
    traffic = {  # tuner/src/problems.c, with the fused add
        "bwd bytes": 3 * t * d * 2 + t * heads * 4 + 3 * t * d * 2 + t * heads * 4,
        "fwd bytes": 3 * t * d * 2 + t * heads * 4 + 2 * t * d * 2,
    }
    plans = {"bwd": (plan_b.level, winner(plan_b, t)), "fwd": (plan_f.level, winner(plan_f, t))}
    return Phase("phase 2", kernels, paths, ("out", "do1", "dlse", "dpartial", "dsublayer", "dquery"), traffic,
                 plans)


def bench_shape(args, name, t, compiled):
    gen = torch.Generator().manual_seed(0)
    p1, (o1, lse) = phase1(name, t, compiled, gen)
    p2 = phase2(name, t, compiled, gen, o1, lse)
    for ph in (p1, p2):
        t0 = time.perf_counter()
        errs, steps = ph.check()
        print(f"\n{name} {ph.name} T={t}: against eager PyTorch (relative norm error; tolerance 1e-2), checked "
              f"in {time.perf_counter() - t0:.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in steps)
              + "; the compile's first call compiles forward and backward):")
        print(f"  {'':<18}" + "".join(f"{x:>11}" for x in ph.labels))
        for k, e in errs.items():
            print(f"  {k:<18}" + "".join(f"{x:>11.2e}" for x in e))
        bad = [k for k, e in errs.items() if not all(x <= 1e-2 for x in e)]
        if bad:
            raise SystemExit(f"{name} {ph.name}: {', '.join(bad)} differ from eager PyTorch beyond 1e-2")
        print(f"  plans: bwd {ph.plans['bwd'][1]} ({ph.plans['bwd'][0]}), "
              f"fwd {ph.plans['fwd'][1]} ({ph.plans['fwd'][0]})", flush=True)

    wait_for_load(args.wait_load, args.wait_max)
    t0 = time.monotonic()
    res = {ph.name: {k: [] for k in CASES} for ph in (p1, p2)}
    for _ in range(args.rounds):
        for ph, calls in ((p1, 1), (p2, args.p2_calls)):
            for _ in range(calls):
                for k in CASES:
                    res[ph.name][k].append(ph.run(k))
    print(f"load average after {name}: {load()} ({args.rounds} rounds in {time.monotonic() - t0:.0f} s)",
          flush=True)
    med = {ph: {k: tuple(statistics.median(x[i] for x in v) * 1e3 for i in range(3)) for k, v in r.items()}
           for ph, r in res.items()}
    # Only the models and plans' names are kept: the buffers go before the next shape.
    return med, {ph.name: (ph.traffic, ph.plans) for ph in (p1, p2)}


def report(results, t, rounds, p2_calls):
    print(f"\nMedian ms, T = {t}, bf16 (torch {torch.__version__}, {torch.get_num_threads()} threads), over "
          f"{rounds} interleaved rounds (phase 2: {rounds} x {p2_calls} calls). bwd: the backward alone; f+b: "
          f"forward and backward of one call; CPU: the process's CPU time (for f+b).")
    labels = {"kernel bwd": "attnres kernel bwd", "kernel fwd": "attnres kernel fwd",
              "attnres": "attnres autograd"}
    print(f"  {'shape':<9}{'phase':<9}{'path':<20}{'bwd ms':>11}{'f+b ms':>11}{'CPU ms':>11}")
    for name, (med, _) in results.items():
        for phase in PHASES:
            for k in CASES:
                bwd, cpu, fb = med[phase][k]
                fbs = "" if k.startswith("kernel") else f"{fb:.2f}"
                print(f"  {name:<9}{phase:<9}{labels.get(k, k):<20}{bwd:>11.2f}{fbs:>11}{cpu:>11.2f}")

    print("\nRatios PyTorch / attnres (wall clock). block: phase 1 + (S - 1) x phase 2, summed from the medians "
          "(derived, not timed):")
    print(f"  {'shape':<9}{'what':<10}{'attnres path':<40}{'attnres ms':>11}{'/ compile':>11}{'/ eager':>11}")
    for name, (med, _) in results.items():
        sites = SHAPES[name][2]
        parts = {"phase 1": {"phase 1": 1}, "phase 2": {"phase 2": 1},
                 "block": {"phase 1": 1, "phase 2": sites - 1}}
        for what, weights in parts.items():
            def tot(k, col):
                return sum(w * med[ph][k][col] for ph, w in weights.items())
            rows = (("bwd, autograd", tot("attnres", 0), 0),
                    ("bwd, kernel", tot("kernel bwd", 0), 0),
                    ("fwd+bwd, autograd", tot("attnres", 2), 2),
                    ("fwd+bwd, kernels", tot("kernel fwd", 0) + tot("kernel bwd", 0), 2))
            for label, ours, col in rows:
                rc, re_ = tot("compile", col) / ours, tot("eager", col) / ours
                print(f"  {name:<9}{what:<10}{label:<40}{ours:>11.1f}{rc:>11.2f}{re_:>11.2f}")


def report_rates(results):
    print("\nThe kernels' rates at the rounds' medians: GB/s of the tuner's traffic model "
          "(tuner/src/problems.c), and for phase 1 GFLOP/s of its flop model (bwd: 3 + 10 S, fwd: 2 + 4 S "
          "flop per element of the n source rows):")
    print(f"  {'shape':<9}{'kernel':<17}{'variant':<42}{'ms':>9}{'GB/s':>8}{'GFLOP/s':>9}")
    for name, (med, phases) in results.items():
        for phase in PHASES:
            tr, plans = phases[phase]
            for k, label in (("bwd", "_backward"), ("fwd", "")):
                ms = med[phase][f"kernel {k}"][0]
                op = phase.replace(" ", "") + label
                fl = tr.get(f"{k} flop")
                gf = f"{fl / (ms * 1e-3) / 1e9:.1f}" if fl else "-"
                print(f"  {name:<9}{op:<17}{plans[k][1]:<42}{ms:>9.2f}"
                      f"{tr[f'{k} bytes'] / (ms * 1e-3) / 1e9:>8.2f}{gf:>9}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnres", default=os.path.join(ROOT, "build", "bin", "attnres"), help="the CLI, for the tune")
    ap.add_argument("--problems", default=os.path.join(HERE, "phase_backward_problems.txt"))
    ap.add_argument("--tune-db", default=os.path.join(ROOT, "build", "bench-data",
                                                      time.strftime("phase-backward-%Y%m%d-%H%M%S.db")))
    ap.add_argument("--db", help="plan from this database and skip the tune ('builtin': the built-in kernels)")
    ap.add_argument("--strategy", default="halving")
    ap.add_argument("--budget", default="2", help="passed to attnres tune")
    ap.add_argument("--retries", type=int, default=0, help="passed to attnres tune (default 0)")
    ap.add_argument("--time-limit", type=int, default=180, help="passed to attnres tune (default 180 s)")
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--p2-calls", type=int, default=5, help="phase 2's calls of each case per round")
    ap.add_argument("--shapes", default="K3,MHAR-8B")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch's intra-op threads (default: torch's own)")
    ap.add_argument("--wait-load", type=float, default=1.5)
    ap.add_argument("--wait-max", type=float, default=180, help="the longest wait, each time, in seconds")
    args = ap.parse_args()
    for name in args.shapes.split(","):
        if name not in SHAPES:
            ap.error(f"unknown shape {name} (one of {', '.join(SHAPES)})")
    if args.t < 1 or args.rounds < 1 or args.p2_calls < 1:
        ap.error("--t, --rounds and --p2-calls must be positive")

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"attnres {attnres.__version__}, commit {commit()}; host: {host_line()}; Python "
          f"{platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} intra-op threads); "
          f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '(unset)')}; "
          f"load average at start: {load()}", flush=True)
    if not args.db:
        wait_for_load(args.wait_load, args.wait_max)
    db = args.db or tune(args)

    import attnres.torch as art

    art.set_database(None if db == "builtin" else db)
    print(f"\nplans from {db}", flush=True)
    compiled = {"phase1": torch.compile(torch_phase1, fullgraph=True, dynamic=False),
                "phase2": torch.compile(torch_phase2, fullgraph=True, dynamic=False)}
    results = {}
    for name in args.shapes.split(","):
        results[name] = bench_shape(args, name, args.t, compiled)
    report(results, args.t, args.rounds, args.p2_calls)
    report_rates(results)
    print(f"\nload average at the end: {load()}; peak resident memory "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
