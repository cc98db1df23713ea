"""Per-call overhead of attnres from Python at T = 1 on the CPU.

Times, interleaved round by round so that both see the same machine:
  C call      attnres_run_mix on the plan, in a C loop inside the extension
              (Plan._time_c), on the very arrays the Python call uses
  plan.mix    the Python call with out= given (what an engine's decode step does)
  plan.mix    the same with the output allocated (NumPy) on every call
and reports medians over the rounds and the overhead above the C call
(goal: <= 3 us). Usage: python bench/python_overhead.py [--d 512] [--n 9]
[--rounds 15] [--calls 2000] [--views]
"""

import argparse
import statistics
import time

import numpy as np

import attnres


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--n", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--views", action="store_true", help="sources as a list of N (1, d) views, not one array")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    src = rng.standard_normal((args.n, 1, args.d)).astype(np.float32)
    sources = list(src) if args.views else src
    q = rng.standard_normal(args.d).astype(np.float32)
    out = np.empty((1, args.d), np.float32)
    with attnres.open_device("cpu") as dev, attnres.Plan(dev, None, d=args.d, n=args.n) as plan:
        rows = {"C call": [], "plan.mix(out=)": [], "plan.mix()": []}
        mix = plan.mix
        for _ in range(args.rounds):
            rows["C call"].append(plan._time_c(args.calls, sources, q, out=out))
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                mix(sources, q, out=out)
            rows["plan.mix(out=)"].append((time.perf_counter_ns() - t0) / args.calls)
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                mix(sources, q)
            rows["plan.mix()"].append((time.perf_counter_ns() - t0) / args.calls)
    print(f"attnres {attnres.__version__} from Python at T = 1 on the CPU: fp32, d = {args.d}, N = {args.n}, "
          f"sources as {'N views' if args.views else 'one array'}; median of {args.rounds} rounds of "
          f"{args.calls} calls")
    base = statistics.median(rows["C call"])
    print(f"{'call':<18}{'median ns':>12}{'above C ns':>12}")
    for name, v in rows.items():
        m = statistics.median(v)
        print(f"{name:<18}{m:>12.1f}{m - base:>12.1f}")


if __name__ == "__main__":
    main()
