"""`attnres run` refuses bad input with a message that names the problem, a
non-zero exit status, and no output file; NaN inside data is not an error and
reaches only its own token's row."""

import math
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import npyio  # noqa: E402
import one_case  # noqa: E402

one_case.take_args(1)
CLI = sys.argv[1]
tmp = one_case.scratch("attnres-bad-")
P = lambda f: os.path.join(tmp, f)  # noqa: E731
N, T, D = npyio.N, npyio.T, npyio.D

npyio.write_small_mix(P("s.npy"), P("w.npy"))
npyio.write_f32(P("w_short.npy"), (D - 1,), [0.1] * (D - 1))
npyio.write_f32(P("p.npy"), (T, D), [0.5] * (T * D))
npyio.write_f32(P("p_wrong.npy"), (T + 1, D), [0.5] * ((T + 1) * D))
npyio.write_f32(P("s_n0.npy"), (0, T, D), [])
npyio.write_f32(P("s_2d.npy"), (T, D), [1.0] * (T * D))
npyio.write_f32(P("w_f64.npy"), (D,), [0.1] * D, descr="<f8")
npyio.write_f32(P("w_be.npy"), (D,), [0.1] * D, descr=">f4")
npyio.write_f32(P("w_fortran.npy"), (D,), [0.1] * D, fortran=True)
with open(P("s.npy"), "rb") as f:
    whole = f.read()
with open(P("s_trunc.npy"), "wb") as f:
    f.write(whole[: len(whole) - 10])
with open(P("s_trunc_header.npy"), "wb") as f:
    f.write(whole[:20])
with open(P("not.npy"), "w") as f:
    f.write("this is not an npy file\n")
with open(P("notdb.db"), "w") as f:
    f.write("not a database either\n")

base = ["run", "--device", "cpu", "--sources", P("s.npy"), "--query", P("w.npy")]


def expect_refusal(name, args, needle):
    """Runs the CLI; passes when it fails, says `needle`, and wrote nothing."""
    if not one_case.wanted(name):
        return
    out = P("out.npy")
    normed = P("normed.npy")
    for f in (out, normed):
        if os.path.exists(f):
            os.remove(f)
    res = subprocess.run([CLI] + args + ["--out", out], capture_output=True, text=True)
    problems = []
    if res.returncode == 0:
        problems.append("exit status 0")
    if needle.lower() not in res.stderr.lower():
        problems.append("message %r lacks %r" % (res.stderr.strip(), needle))
    leftovers = [f for f in os.listdir(tmp) if f.startswith("out.npy") or f.startswith("normed.npy")]
    if leftovers:
        problems.append("left files %s" % leftovers)
    one_case.record(name, problems, res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "")


def replace_arg(args, flag, value):
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


expect_refusal("query shape mismatch", replace_arg(base, "--query", P("w_short.npy")), "shape")
expect_refusal("partial shape mismatch", base + ["--partial", P("p_wrong.npy")], "shape")
expect_refusal("sources not 3-d", replace_arg(base, "--sources", P("s_2d.npy")), "(N, T, d)")
expect_refusal("heads do not divide d", base + ["--heads", "3"], "does not divide")
expect_refusal("heads zero", base + ["--heads", "0"], "heads")
expect_refusal("N = 0", replace_arg(base, "--sources", P("s_n0.npy")), "N = 0")
expect_refusal("float64 query", replace_arg(base, "--query", P("w_f64.npy")), "not float32")
expect_refusal("big-endian query", replace_arg(base, "--query", P("w_be.npy")), "byte order")
expect_refusal("fortran order", replace_arg(base, "--query", P("w_fortran.npy")), "Fortran")
expect_refusal("truncated data", replace_arg(base, "--sources", P("s_trunc.npy")), "truncated")
expect_refusal("truncated header", replace_arg(base, "--sources", P("s_trunc_header.npy")), "truncated")
expect_refusal("not an npy file", replace_arg(base, "--sources", P("not.npy")), "not a .npy")
expect_refusal("missing file", replace_arg(base, "--sources", P("absent.npy")), "cannot open")
expect_refusal("negative eps", base + ["--eps", "-1e-6"], "--eps")
expect_refusal("zero eps", base + ["--eps", "0"], "--eps")
expect_refusal("NaN eps", base + ["--eps", "nan"], "--eps")
expect_refusal("NaN out-eps", base + ["--out-gain", P("w.npy"), "--normed", P("normed.npy"), "--out-eps", "nan"],
               "--out-eps")
expect_refusal("eps not a number", base + ["--eps", "small"], "expects a number")
expect_refusal("unknown flag", base + ["--frobnicate"], "unknown option")
expect_refusal("unknown dtype", base + ["--dtype", "f64"], "--dtype")
expect_refusal("epilogue half given", base + ["--out-gain", P("w.npy")], "epilogue")
expect_refusal("missing database", base + ["--db", P("absent.db")], "no such database")
expect_refusal("not a database", base + ["--db", P("notdb.db")], "not an SQLite database")
expect_refusal("unknown device", replace_arg(base, "--device", "tpu"), "unknown device")


# NaN in one token's source row: only that token's output is NaN.
if one_case.wanted("NaN in token 2 of source 1 reaches token 2 only"):
    vals = npyio.small_mix_sources()
    vals[1 * T * D + 2 * D + 5] = float("nan")  # source 1, token 2
    npyio.write_f32(P("s_nan.npy"), (N, T, D), vals)
    res = subprocess.run([CLI] + replace_arg(base, "--sources", P("s_nan.npy")) + ["--out", P("nan_out.npy")],
                         capture_output=True, text=True)
    problems = []
    if res.returncode != 0:
        problems.append("exit %d %s" % (res.returncode, res.stderr))
    else:
        _, out = npyio.read_f32(P("nan_out.npy"))
        rows = [out[t * D:(t + 1) * D] for t in range(T)]
        nan_rows = [t for t in range(T) if any(math.isnan(x) for x in rows[t])]
        if nan_rows != [2] or not all(math.isnan(x) for x in rows[2]):
            problems.append("rows with NaN %s" % nan_rows)
    one_case.record("NaN in token 2 of source 1 reaches token 2 only", problems)

one_case.finish()
