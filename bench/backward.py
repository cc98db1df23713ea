"""The mix backward on the CPU against PyTorch, in one run: K3 (bf16,
d = 7168, N = 9, H = 1, eps = 1e-5) and MHAR-8B (bf16, d = 4096, N = 9,
H = 8) at T = 4096 by default.

Step 1, the tuned kernels. `attnres tune --device cpu --problems FILE`
(bench/backward_problems.txt: the mix_backward and the forward mix of both
shapes at the T bucket 4096) tunes into --tune-db, and the winners table it
prints is shown: its `paired` column is each winner's time as a fraction of
a streaming pass, timed beside it, that moves the bytes of the tuner's
traffic model. A problem decided wholly from measurements on record has no
such figure (and `attnres tune --revalidate` does not take mix_backward
winners), so each run tunes into a database of its own, --tune-db (default
build/bench-data/backward-DATE-TIME.db). --db DB skips the tune and plans
from DB ('builtin': the built-in kernels).

Step 2, the times, per shape, interleaved round by round (each round runs
every case once, in the same order), after checking that the gradients of
every path agree with eager PyTorch:
  attnres kernel bwd   Plan.mix_backward into preallocated gradients (the C
                       kernel and the Python call; what an engine runs)
  attnres kernel fwd   Plan.mix into a preallocated output
  new (N,T,d) grad     torch.empty of one source-gradient tensor and a store
                       to each of its 4 KiB pages: what every path that
                       returns a fresh gradient pays before writing it
  attnres autograd     torch.ops.attnres.mix forward, then
                       torch.autograd.grad of its output (the registered
                       backward: torch.ops.attnres.mix_backward, gradients
                       allocated by torch), sources as N leaf tensors
  eager                the same for a plain PyTorch implementation of DESIGN
                       section 1 (fp32 arithmetic on the bf16 storage, as
                       bench/python_overhead.py's), sources as one (N, T, d)
                       leaf, run eagerly
  compile              that function through torch.compile (inductor,
                       fullgraph, static shapes)
The autograd rows time forward and backward of one call apart (bwd: the
torch.autograd.grad call alone; fwd+bwd: both). Reported: the median over
the rounds (wall clock, and the process's CPU time), and the ratios
PyTorch / attnres against the goals (>= 3x torch.compile, >= 10x eager,
for the backward and for forward + backward).

Then the kernels' rate in GB/s from memory (at T) and in cache (at
--cache-t tokens, Plan._time_c): whether memory or the core holds them.

torch allocates every output (attnres.torch's gradients included) with
malloc: a fresh mmap at these sizes, faulted in page by page.
THP_MEM_ALLOC_ENABLE=1 in the environment makes torch ask for transparent
huge pages for large allocations (where the kernel's THP mode is madvise);
the header says whether it is set.

Before the tune and before timing each shape, the script waits (up to --wait-max seconds) for the 1-minute
load average to drop below --wait-load, and prints the load before and
after each shape.

Usage (in a venv with torch and the package; see bench/README.md):
  python bench/backward.py [--attnres build/bin/attnres] [--tune-db NEWFILE |
      --db FILE] [--strategy halving] [--budget 4] [--t 4096]
      [--rounds 5] [--shapes K3,MHAR-8B] [--torch-threads N]
      [--wait-load 1.5] [--wait-max 600]
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import attnres

# DESIGN section 1 in plain PyTorch, the baseline both bench scripts time
# (this script's folder is first on sys.path when it runs).
from python_overhead import torch_mix

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SHAPES = {"K3": (7168, 9, 1, 1e-5), "MHAR-8B": (4096, 9, 8, 1e-6)}


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_load(limit, max_s):
    t0 = time.monotonic()
    while os.getloadavg()[0] >= limit and time.monotonic() - t0 < max_s:
        time.sleep(10)
    waited = time.monotonic() - t0
    print(f"load average {load()} after waiting {waited:.0f} s for the 1-minute load to drop below {limit}"
          + ("" if os.getloadavg()[0] < limit else " (it did not: timing anyway)"), flush=True)


# ---- step 1: the tune ------------------------------------------------------


def tune(args):
    os.makedirs(os.path.dirname(os.path.abspath(args.tune_db)), exist_ok=True)
    cmd = [args.attnres, "tune", "--device", "cpu", "--problems", args.problems, "--db", args.tune_db,
           "--strategy", args.strategy, "--jobs", "1"]
    if args.budget:
        cmd += ["--budget", args.budget]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(res.stdout)
    # The tuner's progress goes to stderr; keep its device line and summary.
    for line in res.stderr.splitlines():
        if line.startswith("device ") or " not ok" in line or "provisional" in line or "error" in line.lower():
            print(line)
    print(f"(tune: exit {res.returncode}, {time.monotonic() - t0:.0f} s)", flush=True)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit("the tune failed")
    return args.tune_db


# ---- step 2: the times -------------------------------------------------------


def rel_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / (want.norm() or 1.0))


def bench_shape(args, name, t, compiled):
    import torch
    import attnres.torch as art

    d, n, heads, eps = SHAPES[name]
    gen = torch.Generator().manual_seed(0)
    src = torch.randn(n, t, d, generator=gen).bfloat16()
    u = (torch.randn(d, generator=gen) / d ** 0.5).float()
    dout = torch.randn(t, d, generator=gen).bfloat16()
    rows = list(src.unbind(0))
    op = torch.ops.attnres.mix

    plan_b = art.plan_for(src, op="mix_backward", dtype="bf16", d=d, n=n, heads=heads, form="replace")
    plan_f = art.plan_for(src, op="mix", dtype="bf16", d=d, n=n, heads=heads, form="replace", epilogue=False)
    cap = torch.utils.dlpack.to_dlpack
    dsrc_k = torch.empty(n, t, d, dtype=torch.bfloat16)
    du_k = torch.empty(d, dtype=torch.float32)
    out_k = torch.empty(t, d, dtype=torch.bfloat16)

    def kernel_bwd():
        plan_b.mix_backward([cap(r) for r in rows], cap(u), cap(dout), eps=eps, dsources=cap(dsrc_k),
                            dquery=cap(du_k))

    def kernel_fwd():
        plan_f.mix([cap(r) for r in rows], cap(u), eps=eps, out=cap(out_k))

    def ours():
        leaves = [r.detach().requires_grad_() for r in rows]
        uq = u.detach().requires_grad_()
        t0 = time.perf_counter()
        out = op(leaves, uq, None, None, heads, eps, 1.0, 1.0, 1e-6)[0]
        t1 = time.perf_counter()
        grads = torch.autograd.grad(out, leaves + [uq], dout)
        t2 = time.perf_counter()
        return (t1 - t0, t2 - t1), out, grads[:-1], grads[-1]

    def torch_path(fn):
        def run():
            s = src.detach().requires_grad_()
            uq = u.detach().requires_grad_()
            t0 = time.perf_counter()
            out = fn(s, uq, heads, eps)
            t1 = time.perf_counter()
            ds, du = torch.autograd.grad(out, [s, uq], dout)
            t2 = time.perf_counter()
            return (t1 - t0, t2 - t1), out, ds, du
        return run

    cases = {"attnres": ours, "eager": torch_path(torch_mix), "compile": torch_path(compiled)}

    # The gradients first (this also compiles the forward and backward graphs).
    t0 = time.perf_counter()
    _, out_e, ds_e, du_e = cases["eager"]()
    _, out_a, ds_a, du_a = cases["attnres"]()
    ds_a = torch.stack(ds_a)
    tc = time.perf_counter()
    _, out_c, ds_c, du_c = cases["compile"]()
    tc = time.perf_counter() - tc
    kernel_bwd()
    kernel_fwd()
    errs = {
        "attnres autograd": (rel_err(out_a, out_e), rel_err(ds_a, ds_e), rel_err(du_a, du_e)),
        "attnres kernel": (rel_err(out_k, out_e), rel_err(dsrc_k, ds_e), rel_err(du_k, du_e)),
        "compile": (rel_err(out_c, out_e), rel_err(ds_c, ds_e), rel_err(du_c, du_e)),
    }
    del out_e, ds_e, du_e, out_a, ds_a, du_a, out_c, ds_c, du_c
    print(f"\n{name} T={t}: gradients against eager PyTorch (relative norm error of out, dsources, du; "
          f"tolerance 1e-2), checked in {time.perf_counter() - t0:.1f} s (the compile's first call "
          f"{tc:.1f} s):")
    bad = []
    for k, e in errs.items():
        print(f"  {k:<18}" + "".join(f"{x:>11.2e}" for x in e))
        if not all(x <= 1e-2 for x in e):
            bad.append(k)
    if bad:
        raise SystemExit(f"{name}: {', '.join(bad)} differ from eager PyTorch beyond 1e-2")
    print(f"  plans: mix_backward {plan_b.level}, mix {plan_f.level}")

    def alloc_grad():
        # What a fresh (N, T, d) gradient costs before anything is written:
        # torch.empty, and one store per 4 KiB page (each page faulted in).
        x = torch.empty(n, t, d, dtype=torch.bfloat16)
        x.view(-1)[::2048].zero_()
        del x

    wait_for_load(args.wait_load, args.wait_max)
    res = {k: [] for k in ("kernel bwd", "kernel fwd", "alloc", "attnres", "eager", "compile")}
    for _ in range(args.rounds):
        for k, fn in (("kernel bwd", kernel_bwd), ("kernel fwd", kernel_fwd), ("alloc", alloc_grad)):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            c1, w1 = time.process_time(), time.perf_counter()
            res[k].append((w1 - w0, c1 - c0, w1 - w0))
        for k, fn in cases.items():
            c0 = time.process_time()
            (fwd, bwd), *_ = fn()
            c1 = time.process_time()
            res[k].append((bwd, c1 - c0, fwd + bwd))
    print(f"load average after {name}: {load()}", flush=True)
    med = {k: tuple(statistics.median(x[i] for x in v) * 1e3 for i in range(3)) for k, v in res.items()}

    # Held by memory or by the core: the same kernels on --cache-t tokens,
    # whose rows stay in the cache across calls, against their rate at T.
    tc_ = args.cache_t
    rows_c = [r[:tc_] for r in rows]
    ds_c_, out_c_ = dsrc_k[:, :tc_], out_k[:tc_]
    reps = max(1, int(0.3 / (med["kernel bwd"][0] * 1e-3 * tc_ / t)))
    cache = {"bwd": [], "fwd": []}
    for _ in range(5):  # a capsule is used once: new ones for every call
        cache["bwd"].append(plan_b._time_c(reps, [cap(r) for r in rows_c], cap(u), cap(dout[:tc_]), eps=eps,
                                           dsources=cap(ds_c_), dquery=cap(du_k))[0] * 1e-9)
        cache["fwd"].append(plan_f._time_c(reps, [cap(r) for r in rows_c], cap(u), eps=eps,
                                           out=cap(out_c_))[0] * 1e-9)
    esz = 2
    bytes_b = lambda tt: (2 * n + 1) * tt * d * esz  # noqa: E731 (the tuner's model: N+1 rows read, N written)
    bytes_f = lambda tt: (n + 1) * tt * d * esz  # noqa: E731
    med["gbps"] = {
        "bwd mem": bytes_b(t) / (med["kernel bwd"][0] * 1e-3) / 1e9,
        "bwd cache": bytes_b(tc_) / statistics.median(cache["bwd"]) / 1e9,
        "fwd mem": bytes_f(t) / (med["kernel fwd"][0] * 1e-3) / 1e9,
        "fwd cache": bytes_f(tc_) / statistics.median(cache["fwd"]) / 1e9,
        "bwd cache us": statistics.median(cache["bwd"]) * 1e6,
        "fwd cache us": statistics.median(cache["fwd"]) * 1e6,
    }
    return med


def report(results, t, rounds, torch_threads):
    import torch

    print(f"\nMedian ms over {rounds} interleaved rounds, T = {t}, bf16 (torch {torch.__version__}, "
          f"{torch_threads} threads). bwd: the backward alone; f+b: forward and backward of one call; "
          f"CPU: the process's CPU time for f+b.")
    print(f"  {'shape':<9}{'path':<20}{'bwd ms':>10}{'f+b ms':>10}{'CPU ms':>10}")
    for name, med in results.items():
        for k in ("kernel bwd", "kernel fwd", "alloc", "attnres", "eager", "compile"):
            bwd, cpu, fb = med[k]
            label = {"kernel bwd": "attnres kernel bwd", "kernel fwd": "attnres kernel fwd",
                     "alloc": "new (N,T,d) grad", "attnres": "attnres autograd"}.get(k, k)
            if k.startswith("kernel") or k == "alloc":
                print(f"  {name:<9}{label:<20}{bwd:>10.1f}{'':>10}{cpu:>10.1f}")
            else:
                print(f"  {name:<9}{label:<20}{bwd:>10.1f}{fb:>10.1f}{cpu:>10.1f}")
    print("\nRatios PyTorch / attnres (goal: >= 3 against compile, >= 10 against eager):")
    print(f"  {'shape':<9}{'what':<40}{'/ compile':>10}{'/ eager':>10}  goals")
    for name, med in results.items():
        rows = (("bwd, autograd", med["attnres"][0]), ("bwd, kernel (Plan.mix_backward)", med["kernel bwd"][0]),
                ("fwd+bwd, autograd", med["attnres"][2]),
                ("fwd+bwd, kernels (mix + mix_backward)", med["kernel fwd"][0] + med["kernel bwd"][0]))
        for what, ours in rows:
            col = 2 if what.startswith("fwd") else 0
            rc, re = med["compile"][col] / ours, med["eager"][col] / ours
            met = f"{'met' if rc >= 3 else 'NOT met'} / {'met' if re >= 10 else 'NOT met'}"
            print(f"  {name:<9}{what:<40}{rc:>10.2f}{re:>10.2f}  {met}")


def report_balance(results, t, cache_t):
    print(f"\nThe kernels' rate (GB/s of the tuner's traffic model: the backward reads N+1 rows and writes N, "
          f"the forward reads N and writes 1) from memory at T = {t} (the rounds' median) and in cache at "
          f"T = {cache_t} (Plan._time_c, median of 5): a kernel whose rate in cache is not well above its rate "
          f"from memory is held by the core, not by memory.")
    print(f"  {'shape':<9}{'kernel':<14}{'memory GB/s':>13}{'cache GB/s':>12}{'cache us':>10}")
    for name, med in results.items():
        g = med["gbps"]
        for k, label in (("bwd", "mix_backward"), ("fwd", "mix")):
            print(f"  {name:<9}{label:<14}{g[k + ' mem']:>13.2f}{g[k + ' cache']:>12.2f}{g[k + ' cache us']:>10.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnres", default=os.path.join(ROOT, "build", "bin", "attnres"), help="the CLI, for the tune")
    ap.add_argument("--problems", default=os.path.join(HERE, "backward_problems.txt"))
    ap.add_argument("--tune-db", default=os.path.join(ROOT, "build", "bench-data",
                                                      time.strftime("backward-%Y%m%d-%H%M%S.db")))
    ap.add_argument("--db", help="plan from this database and skip the tune ('builtin': the built-in kernels)")
    ap.add_argument("--strategy", default="halving")
    ap.add_argument("--budget", default="4", help="passed to attnres tune")
    ap.add_argument("--cache-t", type=int, default=32,
                    help="T of the in-cache timing of the kernels (default 32: K3's bytes about 9 MB)")
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="K3,MHAR-8B")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch's intra-op threads (default: torch's own)")
    ap.add_argument("--wait-load", type=float, default=1.5)
    ap.add_argument("--wait-max", type=float, default=600)
    args = ap.parse_args()

    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"attnres {attnres.__version__}; CPU: {cpu_model()}, {os.cpu_count()} cores; Python "
          f"{platform.python_version()}, torch {torch.__version__}; THP_MEM_ALLOC_ENABLE="
          f"{os.environ.get('THP_MEM_ALLOC_ENABLE', '(unset)')}; load average at start: {load()}", flush=True)
    if not args.db:
        wait_for_load(args.wait_load, args.wait_max)
    db = args.db or tune(args)

    import attnres.torch as art

    art.set_database(None if db == "builtin" else db)
    compiled = torch.compile(torch_mix, fullgraph=True, dynamic=False)
    results = {}
    for name in args.shapes.split(","):
        results[name] = bench_shape(args, name, args.t, compiled)
    report(results, args.t, args.rounds, torch.get_num_threads())
    report_balance(results, args.t, args.cache_t)
    import resource

    print(f"\nload average at the end: {load()}; peak resident memory "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
