"""`attnres run` writes its outputs all or none: when one output cannot be
written, every output path still holds exactly what it held before (an older
result, or nothing), and no temporary or backup file is left behind.

Each case gives a writable --out that already holds an earlier result, and a
second output that cannot be written: a path under a missing directory (the
temporary cannot be created), a path that is an existing directory (the last
rename fails, after the first output was renamed into place), and, when the
test does not run as root, a directory without write permission."""

import os
import stat
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import npyio  # noqa: E402
import one_case  # noqa: E402

one_case.take_args(1)
CLI = sys.argv[1]
tmp = one_case.scratch("attnres-atomic-")
P = lambda *f: os.path.join(tmp, *f)  # noqa: E731
N, T, D = npyio.N, npyio.T, npyio.D

npyio.write_small_mix(P("s.npy"), P("w.npy"))
npyio.write_f32(P("g.npy"), (D,), [1.0 + 0.01 * k for k in range(D)])
npyio.write_f32(P("o1.npy"), (T, D), [0.25 * ((i % 9) - 4) for i in range(T * D)])
npyio.write_f32(P("lse.npy"), (T, 1), [0.5] * T)
npyio.write_f32(P("b.npy"), (T, D), [0.125 * ((i % 5) - 2) for i in range(T * D)])
npyio.write_f32(P("f.npy"), (T, D), [0.0625 * ((i % 7) - 3) for i in range(T * D)])
OLD = b"an earlier result the user wants to keep\n"

os.mkdir(P("is_a_dir.npy"))
locked = P("locked")
os.mkdir(locked)
os.chmod(locked, stat.S_IRUSR | stat.S_IXUSR)


def snapshot():
    """Every file under tmp with its bytes, to compare before and after."""
    files = {}
    for root, _, names in os.walk(tmp):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, tmp)] = f.read()
    return files


def expect_untouched(name, args, outputs):
    """outputs: the output paths that already hold OLD before the run."""
    if not one_case.wanted(name):
        return
    for path in outputs:
        with open(path, "wb") as f:
            f.write(OLD)
    before = snapshot()
    res = subprocess.run([CLI] + args, capture_output=True, text=True)
    after = snapshot()
    problems = []
    if res.returncode == 0:
        problems.append("exit status 0")
    if not res.stderr.strip():
        problems.append("no error message")
    for path in outputs:
        rel = os.path.relpath(path, tmp)
        if rel not in after:
            problems.append("%s was deleted" % rel)
        elif after[rel] != OLD:
            problems.append("%s was overwritten" % rel)
    extra = sorted(set(after) - set(before))
    if extra:
        problems.append("left files %s" % extra)
    if problems:
        problems.append("stderr: %s" % res.stderr.strip())
    one_case.record(name, problems, res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "")


mix = ["run", "--device", "cpu", "--sources", P("s.npy"), "--query", P("w.npy"), "--out", P("out.npy"),
       "--out-gain", P("g.npy")]
expect_untouched("mix, --normed under a missing directory", mix + ["--normed", P("absent", "normed.npy")],
                 [P("out.npy")])
expect_untouched("mix, --normed is a directory (the last rename fails)", mix + ["--normed", P("is_a_dir.npy")],
                 [P("out.npy")])
if os.geteuid() != 0:
    expect_untouched("mix, --normed in a read-only directory", mix + ["--normed", os.path.join(locked, "n.npy")],
                     [P("out.npy")])
else:
    print("note: running as root, so the read-only directory case is covered by the two above")

phase2 = ["run", "--device", "cpu", "--op", "phase2", "--o1", P("o1.npy"), "--lse", P("lse.npy"), "--partial",
          P("b.npy"), "--query", P("w.npy"), "--out", P("out.npy"), "--out-gain", P("g.npy"), "--normed",
          P("normed.npy"), "--sublayer", P("f.npy")]
expect_untouched("phase2, --partial-out is a directory after two good outputs",
                 phase2 + ["--partial-out", P("is_a_dir.npy")], [P("out.npy"), P("normed.npy")])
expect_untouched("phase2, --partial-out under a missing directory",
                 phase2 + ["--partial-out", P("absent", "b2.npy")], [P("out.npy"), P("normed.npy")])

phase1 = ["run", "--device", "cpu", "--op", "phase1", "--sources", P("s.npy"), "--queries", P("o1.npy"),
          "--out", P("out.npy")]
expect_untouched("phase1, --lse is a directory", phase1 + ["--lse", P("is_a_dir.npy")], [P("out.npy")])

# And a run that succeeds replaces the earlier results and leaves nothing else.
if one_case.wanted("a successful run replaces the earlier output and leaves no temporaries"):
    with open(P("out.npy"), "wb") as f:
        f.write(OLD)
    before = set(snapshot())
    res = subprocess.run([CLI] + mix + ["--normed", P("normed_ok.npy")], capture_output=True, text=True)
    after = snapshot()
    extra = sorted(set(after) - before - {"normed_ok.npy"})
    ok = res.returncode == 0 and after.get("out.npy") != OLD and npyio.read_f32(P("out.npy"))[0] == (T, D)
    one_case.record("a successful run replaces the earlier output and leaves no temporaries",
                    [] if ok and not extra else
                    ["exit %d, extra files %s, %s" % (res.returncode, extra, res.stderr.strip())])

os.chmod(locked, stat.S_IRWXU)
one_case.finish()
