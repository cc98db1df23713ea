"""attnres from Python on the CPU: the per-call overhead at T = 1, and
end-to-end time against PyTorch eager and torch.compile, in one run.

Part 1, the overhead (fp32, d = 512, N = 9, T = 1 by default). Timed
interleaved round by round, so that every row sees the same machine:
  C call                  attnres_run_mix on the plan in a C loop inside the
                          extension (Plan._time_c), on the very arrays the
                          Python calls below use
  plan.mix(out=) NumPy    the Python call with out= given (an engine's decode step)
  plan.mix() NumPy        the same with the output allocated on every call
  plan.mix(out=) torch    the Python call on torch CPU tensors (Tensor.__dlpack__)  (torch only)
  plan.mix(out=) to_dlpack  the same with torch.utils.dlpack.to_dlpack capsules,
                          as attnres.torch passes them                  (torch only)
  torch.ops.attnres.mix   the torch op, outputs allocated by torch      (torch only)
Reported: the median ns per call over the rounds, and the median over the
rounds of (row - C call) in the same round, by the wall clock and by the
thread's CPU clock (on a loaded machine the wall clock also counts the time
the thread waited for a core; the CPU clock does not). Goal: plan.mix(out=)
at most 3 us above the C call.

Part 2, end to end (torch only): the K3 shape (bf16, d = 7168, N = 9, H = 1,
eps = 1e-5) and the MHAR-8B shape (bf16, d = 4096, N = 9, H = 8) at
T = 1, 64 and 1024: torch.ops.attnres.mix against a plain PyTorch
implementation of DESIGN section 1 (fp32 arithmetic on the bf16 storage, as
the design prescribes) run eagerly and through torch.compile (inductor,
fullgraph). Interleaved round by round as well; each output is checked
against the eager one first.

The plans come from --db (a tuning database; bench/python_problems.txt
lists the problems these tables need) or the built-in kernels; the table
says which fallback level every plan got.

Usage: python bench/python_overhead.py [--db FILE] [--d 512] [--n 9]
       [--rounds 15] [--calls 2000] [--e2e-rounds 7] [--t 1,64,1024] [--no-e2e]
       [--torch-threads 1]
"""

import argparse
import os
import platform
import statistics
import time

import numpy as np

import attnres

try:
    import torch
except ImportError:  # the overhead part needs only NumPy
    torch = None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def timed(fn, calls):
    """Mean ns per call of fn by the wall clock and by this thread's CPU
    clock (which leaves out the time the thread waited for a core)."""
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(calls):
        fn()
    c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
    return (w1 - w0) / calls, (c1 - c0) / calls


def report(title, rows, base):
    """rows: name -> per-round (wall, cpu) ns; base: the row the differences
    are taken against, round by round."""
    print(title)
    print(f"  {'call':<26}{'wall ns':>10}{'above C':>10}{'CPU ns':>10}{'above C':>10}")
    for name, v in rows.items():
        cols = []
        for k in (0, 1):
            cols.append(statistics.median(x[k] for x in v))
            cols.append(statistics.median(x[k] - b[k] for x, b in zip(v, rows[base])))
        print(f"  {name:<26}" + "".join(f"{c:>10.1f}" for c in cols))


def overhead(args, db):
    rng = np.random.default_rng(0)
    src = rng.standard_normal((args.n, 1, args.d)).astype(np.float32)
    q = rng.standard_normal(args.d).astype(np.float32)
    out = np.empty((1, args.d), np.float32)
    dev = attnres.open_device("cpu")
    plan = attnres.Plan(dev, db, d=args.d, n=args.n)
    mix = plan.mix
    cases = {
        "C call": lambda: plan._time_c(args.calls, src, q, out=out),
        "plan.mix(out=) NumPy": lambda: timed(lambda: mix(src, q, out=out), args.calls),
        "plan.mix() NumPy": lambda: timed(lambda: mix(src, q), args.calls),
    }
    if torch is not None:
        import attnres.torch as art

        art.set_database(args.db)
        ts, tq, tout = torch.from_numpy(src), torch.from_numpy(q), torch.from_numpy(out)
        rows_t = list(ts.unbind(0))
        op = torch.ops.attnres.mix
        op(rows_t, tq, None, None, 1, 1e-6, 1.0, 1.0, 1e-6)  # makes the op's cached plan
        op_plan = art.plan_for(ts, op="mix", dtype="f32", d=args.d, n=args.n, heads=1, form="replace",
                               epilogue=False)
        cap = torch.utils.dlpack.to_dlpack
        cases["plan.mix(out=) torch"] = lambda: timed(lambda: mix(ts, tq, out=tout), args.calls)
        cases["plan.mix(out=) to_dlpack"] = lambda: timed(lambda: mix(cap(ts), cap(tq), out=cap(tout)), args.calls)
        cases["torch.ops.attnres.mix"] = lambda: timed(
            lambda: op(rows_t, tq, None, None, 1, 1e-6, 1.0, 1.0, 1e-6), args.calls)
    rows = {name: [] for name in cases}
    for name, fn in cases.items():  # warm-up round
        fn()
    for _ in range(args.rounds):
        for name, fn in cases.items():
            rows[name].append(fn())
    report(f"Per-call overhead at T = 1: fp32, d = {args.d}, N = {args.n}, sources as one array; "
           f"plan level {plan.level}{'' if torch is None else ', torch op plan level ' + op_plan.level}; "
           f"median of {args.rounds} rounds of {args.calls} calls", rows, "C call")
    plan.close()
    dev.close()


# ---- end to end against PyTorch ------------------------------------------------

SHAPES = [("K3", 7168, 9, 1, 1e-5), ("MHAR-8B", 4096, 9, 8, 1e-6)]


def torch_mix(sources, u, heads: int, eps: float):
    """DESIGN section 1 in plain PyTorch: fp32 arithmetic, storage dtype out."""
    v = sources.float()
    n, t, d = v.shape
    r = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    s = (r * v * u).view(n, t, heads, d // heads).sum(-1)
    w = torch.softmax(s, dim=0)
    return (w.unsqueeze(-1) * v.view(n, t, heads, d // heads)).sum(0).view(t, d).to(sources.dtype)


def end_to_end(args):
    import attnres.torch as art

    art.set_database(args.db)
    compiled = torch.compile(torch_mix, fullgraph=True, dynamic=False)
    op = torch.ops.attnres.mix
    print()
    print(f"End to end on the CPU (torch {torch.__version__}, {torch.get_num_threads()} threads): bf16, "
          f"median ms per call (wall clock) over {args.e2e_rounds} interleaved rounds; ratios PyTorch / attnres "
          f"by the wall clock and by the process's CPU time")
    print(f"  {'':<24}{'wall ms':^34}{'wall ratio':^21}{'CPU ratio':^21}")
    print(f"  {'shape':<9}{'T':>6}{'level':>9}{'attnres op':>12}{'eager':>11}{'compile':>11}"
          f"{'eager/ar':>10}{'compile/ar':>11}{'eager/ar':>10}{'compile/ar':>11}")
    gen = torch.Generator().manual_seed(0)
    for name, d, n, heads, eps in SHAPES:
        for t in args.t:
            src = torch.randn(n, t, d, generator=gen).bfloat16()
            u = torch.randn(d, generator=gen)
            rows = list(src.unbind(0))

            def ours():
                return op(rows, u, None, None, heads, eps, 1.0, 1.0, 1e-6)[0]

            want = torch_mix(src, u, heads, eps)
            for label, got in (("attnres", ours()), ("compile", compiled(src, u, heads, eps))):
                err = float((got.float() - want.float()).norm() / want.float().norm())
                if err > 1e-2:
                    raise SystemExit(f"{name} T={t}: {label} differs from eager by {err:.2e}")
            level = art.plan_for(src, op="mix", dtype="bf16", d=d, n=n, heads=heads, form="replace",
                                 epilogue=False).level
            # About 0.2 s of the slowest variant per round.
            t0 = time.perf_counter()
            torch_mix(src, u, heads, eps)
            calls = max(1, min(2000, int(0.2 / max(time.perf_counter() - t0, 1e-6))))
            cases = {"attnres": ours, "eager": lambda: torch_mix(src, u, heads, eps),
                     "compile": lambda: compiled(src, u, heads, eps)}
            res = {k: [] for k in cases}
            for _ in range(args.e2e_rounds):
                for k, fn in cases.items():
                    w0, c0 = time.perf_counter_ns(), time.process_time_ns()
                    for _ in range(calls):
                        fn()
                    c1, w1 = time.process_time_ns(), time.perf_counter_ns()
                    res[k].append(((w1 - w0) / calls / 1e6, (c1 - c0) / calls / 1e6))
            m = {k: statistics.median(x[0] for x in v) for k, v in res.items()}
            c = {k: statistics.median(x[1] for x in v) for k, v in res.items()}
            print(f"  {name:<9}{t:>6}{level:>9}{m['attnres']:>12.4f}{m['eager']:>11.4f}{m['compile']:>11.4f}"
                  f"{m['eager'] / m['attnres']:>10.2f}{m['compile'] / m['attnres']:>11.2f}"
                  f"{c['eager'] / c['attnres']:>10.2f}{c['compile'] / c['attnres']:>11.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="a tuning database to plan from (default: the built-in kernels)")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--n", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--e2e-rounds", type=int, default=7)
    ap.add_argument("--t", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 1024])
    ap.add_argument("--no-e2e", action="store_true", help="only the overhead table")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch's intra-op threads (default 1: the tuned CPU kernels of a loaded 2-core "
                         "machine run on one thread, and a second torch thread waits for a busy core)")
    args = ap.parse_args()
    if torch is not None:
        torch.set_num_threads(args.torch_threads)
    print(f"attnres {attnres.__version__}; CPU: {cpu_model()}, {os.cpu_count()} cores; "
          f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    db = attnres.open_db(args.db) if args.db else None
    overhead(args, db)
    if db is not None:
        db.close()
    if args.no_e2e:
        return
    if torch is None:
        print("\nEnd to end: skipped, torch is not installed")
        return
    end_to_end(args)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
