"""The command line on databases at odd paths: `plan`, `db show` and `run`
read a database in a read-only directory (a WAL database, whose -shm file
SQLite cannot create there), and refuse a FIFO given as --db at once, with a
message, instead of waiting for a writer that never comes.

The read-only directory is made by read_only_dir.py; where it cannot be
made, those checks say why and the script exits 77 (ctest's skip) unless a
check failed. Every command runs under a timeout: one that blocks fails.

    python3 tests/cli/test_db_odd_files.py [--list] [--case NAME]... CLI
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import npyio  # noqa: E402
import one_case  # noqa: E402
import read_only_dir  # noqa: E402

one_case.take_args(1)
CLI = sys.argv[1]
TIMEOUT = 30
HERE = os.path.dirname(os.path.abspath(__file__))
EXPORT = os.path.join(HERE, "..", "fuzz", "corpus", "db_import", "ok-v1-fixture-export.json")

skips = 0
tmp = one_case.scratch("attnres-odd-db-")
P = lambda f: os.path.join(tmp, f)  # noqa: E731
npyio.write_small_mix(P("s.npy"), P("w.npy"))


def cli(args, prefix=()):
    """Runs the command line under the timeout: (exit status or 'timeout', stdout, stderr, seconds)."""
    start = time.monotonic()
    try:
        r = subprocess.run(list(prefix) + [CLI] + args, capture_output=True, text=True, timeout=TIMEOUT)
        return r.returncode, r.stdout, r.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired:
        return "timeout", "", f"still running after {TIMEOUT} s", time.monotonic() - start


def report(name, ok, detail):
    one_case.record(name, [] if ok else [detail])


# A database in WAL mode, closed cleanly (no -wal, no -shm beside it), in a
# directory of its own that is made read-only for each command.
ro = P("ro")
os.mkdir(ro)
db = os.path.join(ro, "t.db")
made = subprocess.run([CLI, "db", "import", EXPORT, "--db", db], capture_output=True, text=True)
if made.returncode != 0:
    print("cannot make the database: " + made.stderr)
    sys.exit(1)
prefix = why = None

PLAN = ["plan", "--device", "cpu", "--dtype", "f32", "--d", "256", "--n", "5"]
RUN = ["run", "--device", "cpu", "--sources", P("s.npy"), "--query", P("w.npy")]
READS = [
    ("plan reads a database in a read-only directory", PLAN + ["--db", db, "--explain"], "plan level"),
    ("db show reads a database in a read-only directory", ["db", "show", "--db", db], "mix:f32:d256:n5"),
    ("run reads a database in a read-only directory", RUN + ["--db", db, "--out", P("out.npy")], None),
]
for name, args, needle in READS:
    if not one_case.wanted(name):
        continue
    if prefix is None and why is None:
        prefix, why = read_only_dir.read_only_prefix(ro)
    if prefix is None:
        skips += 1
        print("skip %s: cannot make a read-only directory here: %s" % (name, why))
        continue
    status, out, err, _ = cli(args, prefix)
    ok = status == 0 and (needle is None or needle in out) and (args[0] != "run" or os.path.exists(P("out.npy")))
    report(name, ok, "exit %s, stdout %r, stderr %r" % (status, out[-400:], err[-400:]))
read_only_dir.restore(ro)

# A FIFO nobody writes: SQLite's open for reading would wait for a writer.
fifo = P("fifo.db")
os.mkfifo(fifo)
for name, args in [
    ("plan --db FIFO is refused at once", PLAN + ["--db", fifo]),
    ("db show --db FIFO is refused at once", ["db", "show", "--db", fifo]),
    ("run --db FIFO is refused at once", RUN + ["--db", fifo, "--out", P("fifo_out.npy")]),
]:
    if not one_case.wanted(name):
        continue
    status, out, err, secs = cli(args)
    ok = status not in (0, "timeout") and "not a regular file" in err and fifo in err
    report(name, ok, "exit %s after %.1f s, stderr %r" % (status, secs, err[-400:]))

passed, failures = one_case.counts()
if skips and not failures:
    print("%d passed, %d skipped (no read-only directory here)" % (passed, skips))
    sys.exit(77)
one_case.finish()
