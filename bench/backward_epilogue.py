"""What the output-norm epilogue adds to the mix backward on the CPU: the
plan of a problem with the epilogue (its prologue reads the forward's out
and the gradient of normed, and makes each token's gradient of out in fp32
before the sweeps) against the plain problem's plan, on the same sources,
in interleaved rounds. K3 (bf16, d = 7168, N = 9, H = 1) and MHAR-8B (bf16,
d = 4096, N = 9, H = 8) at T = 4096 by default.

Each plan's time is Plan._time_c's mean over --reps calls into preallocated
gradients (the C call alone), the median over --rounds rounds; its rate
counts the rows it moves: the plain backward reads N + 1 rows a token (the
sources and dout) and writes N, the epilogue's reads two more (out and
dnormed).

Usage (in a venv with torch and the package, as bench/backward.py):
  python bench/backward_epilogue.py [--db FILE | builtin] [--t 4096]
      [--rounds 7] [--reps 3] [--shapes K3,MHAR-8B]
"""

import argparse
import os
import re
import statistics

import torch

import attnres
from python_overhead import cpu_model  # the script's own folder is on sys.path

SHAPES = {"K3": (7168, 9, 1), "MHAR-8B": (4096, 9, 8)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="builtin", help="plan from this database ('builtin': the built-in kernels)")
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shapes", default="K3,MHAR-8B")
    args = ap.parse_args()
    if args.t < 1 or args.rounds < 1 or args.reps < 1:
        ap.error("--t, --rounds and --reps must be positive")
    db = None if args.db == "builtin" else args.db
    dev = attnres.open_device("cpu")
    print(f"attnres {attnres.__version__}; CPU: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f}; plans from {args.db}")
    gen = torch.Generator().manual_seed(7)
    t = args.t
    for name in args.shapes.split(","):
        if name not in SHAPES:
            ap.error(f"unknown shape {name} (one of {', '.join(SHAPES)})")
        d, n, heads = SHAPES[name]

        def rows(*shape):
            return torch.randn(*shape, generator=gen).to(torch.bfloat16)

        src = [rows(t, d) for _ in range(n)]
        w = torch.randn(d, generator=gen) / d ** 0.5
        dout, out, dnormed = rows(t, d), rows(t, d), rows(t, d)
        og = 1 + 0.1 * torch.randn(d, generator=gen)
        dsrc = torch.empty(n, t, d, dtype=torch.bfloat16)
        dq, dog = torch.empty(d), torch.empty(d)
        plain = attnres.Plan(dev, db, op="mix_backward", dtype="bf16", d=d, n=n, heads=heads)
        epi = attnres.Plan(dev, db, op="mix_backward", dtype="bf16", d=d, n=n, heads=heads, epilogue=True)
        cases = {
            "plain": (plain, lambda: plain._time_c(args.reps, src, w, dout, dsources=dsrc, dquery=dq), n + 1),
            "epilogue": (epi, lambda: epi._time_c(args.reps, src, w, dout, dsources=dsrc, dquery=dq, out=out,
                                                  out_gain=og, dnormed=dnormed, dout_gain=dog), n + 3),
        }
        times = {k: [] for k in cases}
        for _ in range(args.rounds):
            for k, (_, call, _) in cases.items():
                times[k].append(call()[0] / 1e6)
        print(f"\n{name} (bf16, d = {d}, N = {n}, H = {heads}), T = {t}: median ms over {args.rounds} rounds "
              f"of {args.reps} calls; load average {os.getloadavg()[0]:.2f}")
        base = statistics.median(times["plain"])
        for k, (plan, _, reads) in cases.items():
            ms = statistics.median(times[k])
            gbs = (reads + n) * t * d * 2 / (ms / 1e3) / 1e9
            kernel = re.search(r"kernel (\S+)", plan.explain())
            print(f"  {k:<9} {ms:8.2f} ms  {gbs:6.2f} GB/s  x{ms / base:5.3f}  {kernel.group(1) if kernel else '?'}")


if __name__ == "__main__":
    main()
