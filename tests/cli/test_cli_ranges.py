"""Every integer a user gives the command line is range-checked: a value that
does not fit (4294967299 for a 32-bit field) is refused with exit status 2 and
a message naming the flag or field and the range it allows, never truncated
(`plan --n 4294967299` used to plan N = 3)."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import one_case  # noqa: E402

one_case.take_args(1)
CLI = os.path.abspath(sys.argv[1])
failures = 0
tmp = one_case.scratch("attnres-ranges-")
P = lambda f: os.path.join(tmp, f)  # noqa: E731


def run(args, timeout=60):
    try:
        return subprocess.run([CLI] + args, capture_output=True, text=True, timeout=timeout, cwd=tmp)
    except subprocess.TimeoutExpired:
        return None


def expect(name, args, code, needles):
    """Passes when the CLI exits with `code` and stderr holds every needle."""
    if not one_case.wanted(name):
        return
    res = run(args)
    problems = []
    if res is None:
        problems.append("still running after 60 s (the value was accepted)")
    else:
        if res.returncode != code:
            problems.append("exit status %d, want %d" % (res.returncode, code))
        for needle in needles:
            if needle not in res.stderr:
                problems.append("message %r lacks %r" % (res.stderr.strip(), needle))
    last = res.stderr.strip().splitlines()[-1] if res and res.stderr.strip() else "exit %d" % code
    one_case.record(name, problems, last)


plan = ["plan", "--device", "cpu", "--dtype", "f32", "--d", "64"]
expect("plan: N and H beyond 32 bits", plan + ["--n", "4294967299", "--heads", "4294967297"], 2,
       ["--n", "1 to 1048576", "4294967299"])
expect("plan: H beyond 32 bits", plan + ["--n", "3", "--heads", "4294967297"], 2, ["--heads", "1 to 1048576"])
expect("plan: d beyond int64", ["plan", "--device", "cpu", "--n", "3", "--d", "99999999999999999999"], 2,
       ["--d", "1 to 16777216"])
expect("plan: d too large", ["plan", "--device", "cpu", "--n", "3", "--d", "4294967360"], 2, ["--d", "1 to 16777216"])
expect("plan: negative N", plan + ["--n", "-1"], 2, ["--n", "1 to 1048576"])
expect("plan: N with a sign and spaces", plan + ["--n", " +3"], 2, ["--n"])
expect("plan: N not a number", plan + ["--n", "3x"], 2, ["--n", "integer"])
expect("plan: a valid problem still plans", plan + ["--n", "3", "--heads", "2"], 0, [])
# The phases' backwards: S and the workspace's tokens in range, and S needed.
bw1 = plan + ["--op", "phase1_backward", "--n", "3"]
expect("plan: phase1_backward S beyond its limit", bw1 + ["--s", "4097"], 2, ["--s", "1 to 4096"])
expect("plan: phase1_backward S beyond 32 bits", bw1 + ["--s", "4294967298"], 2, ["--s", "1 to 4096"])
expect("plan: phase1_backward without S", bw1, 2, ["phase1_backward needs S"])
bw2 = plan + ["--op", "phase2_backward", "--n", "1", "--fuse-add"]
expect("plan: phase2_backward tokens zero", bw2 + ["--tokens", "0"], 2, ["--tokens", "1 to 16777216"])
expect("plan: phase2_backward tokens beyond the largest bucket", bw2 + ["--tokens", "16777217"], 2,
       ["--tokens", "1 to 16777216"])
expect("plan: phase2_backward plans, with its workspace", bw2 + ["--tokens", "16777216"], 0, [])

run_base = ["run", "--device", "cpu", "--sources", P("absent.npy"), "--query", P("absent.npy"), "--out", P("o.npy")]
expect("run: heads beyond 32 bits", run_base + ["--heads", "4294967297"], 2, ["--heads", "1 to 1048576"])
expect("run: heads zero", run_base + ["--heads", "0"], 2, ["--heads", "1 to 1048576"])

# tune's flags are checked before anything is opened; the problems file does
# not exist, so a flag that got through would end in a different message.
tune = ["tune", "--device", "cpu", "--db", P("t.db"), "--problems", P("absent.txt"), "--quiet"]
expect("tune: jobs beyond 32 bits", tune + ["--jobs", "4294967297"], 2, ["--jobs", "1 to 256"])
expect("tune: jobs zero", tune + ["--jobs", "0"], 2, ["--jobs", "1 to 256"])
expect("tune: budget zero", tune + ["--budget", "0"], 2, ["--budget", "1 to 1000000"])
expect("tune: budget beyond int64", tune + ["--budget", "99999999999999999999"], 2, ["--budget", "1 to 1000000"])
expect("tune: negative seed", tune + ["--seed", "-1"], 2, ["--seed", "0 to 9223372036854775807"])
expect("tune: shard beyond 32 bits", tune + ["--shard", "4294967297/4294967298"], 2, ["--shard", "1 to 4096"])
expect("tune: shard index not below count", tune + ["--shard", "2/2"], 2, ["--shard", "0 to 1"])
expect("tune: shard with junk", tune + ["--shard", "1/2x"], 2, ["--shard"])
expect("tune: infinite time limit", tune + ["--time-limit", "inf"], 2, ["--time-limit", "finite"])
expect("tune: infinite budget seconds", tune + ["--budget", "infs"], 2, ["--budget", "finite"])

# Fields of a problems file: N = 4294967298 used to tune N = 2.
with open(P("big_n.txt"), "w") as f:
    f.write("mix f32 64 4294967298 1 replace 0 1\n")
expect("problems file: N beyond 32 bits", ["tune", "--device", "cpu", "--db", P("t.db"), "--problems",
                                             P("big_n.txt"), "--quiet"], 2, ["big_n.txt:1", "N", "1 to 1048576"])
with open(P("big_t.txt"), "w") as f:
    f.write("mix f32 64 3 1 replace 0 1,99999999999999999999\n")
expect("problems file: T beyond int64", ["tune", "--device", "cpu", "--db", P("t.db"), "--problems",
                                           P("big_t.txt"), "--quiet"], 2, ["big_t.txt:1", "T", "1 to 16777216"])
if os.path.exists(P("t.db")):
    failures += 1
    print("FAIL a refused tune created its database")

one_case.finish(0, failures)
