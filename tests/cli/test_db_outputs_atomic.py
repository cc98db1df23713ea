"""`attnres db export --out FILE` and `attnres db plot --out DIR` write whole
files or nothing (cli/atomic_file.c): when an export fails midway (a database damaged
after the first sections) or a plot fails at its second chart, every target
file keeps the bytes it had, and no temporary is left beside it.

usage: test_db_outputs_atomic.py ATTNRES_CLI"""

import atexit
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

CLI = sys.argv[1]
passed = failures = 0
tmp = tempfile.mkdtemp(prefix="attnres-atomic-")
# Removed however the test ends (a failed check, an exception or sys.exit).
atexit.register(shutil.rmtree, tmp, ignore_errors=True)
P = lambda f: os.path.join(tmp, f)  # noqa: E731
KEY = "mix:f32:d16:n2:h1:replace:epi0:s0:t8"
KEY2 = "mix:f32:d32:n2:h1:replace:epi0:s0:t8"


def check(ok, what):
    global passed, failures
    if ok:
        passed += 1
        print("ok   " + what)
    else:
        failures += 1
        print("FAIL " + what)


def cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def leftovers(d):
    return [n for n in os.listdir(d) if ".tmp-" in n]


def problem(key, d):
    return {"key": key, "op": "mix", "dtype": "f32", "form": "replace", "d": d, "n": 2, "heads": 1,
            "epilogue": 0, "s": 0, "t_bucket": 8}


# A small history: one device, run, candidate, measurement and winner.
doc = {
    "format": "attnres-export", "version": 1,
    "devices": [{"fingerprint": "fp", "backend": "cpu", "name": "test cpu"}],
    "problems": [problem(KEY, 16)],
    "candidates": [{"variant": "v1", "source_hash": "h1", "source": "int x;"}],
    "runs": [{"uid": "run-1", "started_at": "2025-01-01T00:00:00.000Z", "status": "complete",
              "device": "fp", "copy_gbps": 20.0}],
    "measurements": [{"id": 1, "run": "run-1", "problem": KEY, "variant": "v1", "source_hash": "h1",
                      "device": "fp", "status": "ok", "median_us": 3.0, "spread_us": 0.1, "reps": 10,
                      "gbps": 1.0, "ceiling_fraction": 0.05, "created_at": "2025-01-01T00:00:01.000Z"}],
    "winners": [{"run": "run-1", "problem": KEY, "device": "fp", "variant": "v1", "source_hash": "h1",
                 "measurement": 1}],
}
with open(P("in.json"), "w") as f:
    json.dump(doc, f)
db = P("t.db")
r = cli("db", "import", P("in.json"), "--db", db)
check(r.returncode == 0, "the history imports: " + r.stderr.strip())

# Enough measurements that the table spans many pages after the ones that
# hold devices, problems, candidates and runs.
con = sqlite3.connect(db)
con.executemany(
    "INSERT INTO measurements(run_id, candidate_id, problem_id, device_id, status, median_us, message,"
    " created_at) VALUES(1, 1, 1, 1, 'ok', ?, ?, 't')",
    [(3.0 + i / 1000.0, "padding " * 20) for i in range(3000)])
con.commit()
con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
con.close()

# ---- export -------------------------------------------------------------------
out = P("out.json")
csv = P("out.csv")
r = cli("db", "export", "--json", "--db", db, "--out", out)
check(r.returncode == 0 and json.loads(read(out))["measurements"], "a good export writes the file")
r = cli("db", "export", "--csv", "--db", db, "--out", csv)
check(r.returncode == 0 and read(csv).startswith(b"measurement_id,"), "a good CSV export writes the file")
old_json, old_csv = read(out), read(csv)
mode = os.stat(out).st_mode & 0o777

# Damage the measurements' leaf pages past the first few, in a copy: the
# export writes devices, problems, candidates and runs, then fails reading.
bad = P("damaged.db")
shutil.copy(db, bad)
con = sqlite3.connect(db)
pages = [p for (p,) in con.execute(
    "SELECT pageno FROM dbstat WHERE name = 'measurements' AND pagetype = 'leaf' ORDER BY pageno")]
size = con.execute("PRAGMA page_size").fetchone()[0]
con.close()
check(len(pages) > 20, "the measurements span %d leaf pages" % len(pages))
with open(bad, "r+b") as f:
    for p in pages[len(pages) // 2:]:
        f.seek((p - 1) * size)
        f.write(b"\xa5" * size)
for args, path, before in ((["--json"], out, old_json), (["--csv"], csv, old_csv)):
    r = cli("db", "export", *args, "--db", bad, "--out", path)
    check(r.returncode == 1 and r.stderr.strip(),
          "%s export of a damaged database fails (%s)" % (args[0], r.stderr.strip()[:80]))
    check(read(path) == before, "%s: the earlier file keeps its bytes" % args[0])
check(os.stat(out).st_mode & 0o777 == mode, "the earlier file keeps its permissions")
check(not leftovers(tmp), "no temporary left beside the file: %s" % leftovers(tmp))

# A new file is created only by a whole export.
r = cli("db", "export", "--json", "--db", bad, "--out", P("new.json"))
check(r.returncode == 1 and not os.path.exists(P("new.json")), "a failed export creates no file")
# A target that is a directory, or in a missing one, is refused cleanly.
r = cli("db", "export", "--json", "--db", db, "--out", P("nodir/x.json"))
check(r.returncode == 1 and "cannot write" in r.stderr, "a missing directory is refused: " + r.stderr.strip())

# ---- plot -------------------------------------------------------------------------
plots = P("plots")
r = cli("db", "plot", "--db", db, "--out", plots)
check(r.returncode == 0 and os.path.exists(os.path.join(plots, "index.html")),
      "a good plot writes its files: " + " ".join(sorted(os.listdir(plots))))
before = {n: read(os.path.join(plots, n)) for n in os.listdir(plots)}

# A second problem whose winner has no time: its chart has no point to draw,
# so the plot fails after it has written the ceiling chart and the first chart.
con = sqlite3.connect(db)
con.execute("INSERT INTO problems(key, op, dtype, form, d, n, heads, epilogue, s, t_bucket)"
            " VALUES(?, 'mix', 'f32', 'replace', 32, 2, 1, 0, 0, 8)", (KEY2,))
pid = con.execute("SELECT id FROM problems WHERE key = ?", (KEY2,)).fetchone()[0]
mid = con.execute("INSERT INTO measurements(run_id, candidate_id, problem_id, device_id, status,"
                  " created_at) VALUES(1, 1, ?, 1, 'ok', 't')", (pid,)).lastrowid
con.execute("INSERT INTO winners(run_id, problem_id, device_id, candidate_id, measurement_id, created_at)"
            " VALUES(1, ?, 1, 1, ?, 't')", (pid, mid))
con.commit()
con.close()
r = cli("db", "plot", "--db", db, "--out", plots)
check(r.returncode == 1 and "latency-002" in r.stderr, "the plot fails at its second chart: " + r.stderr.strip())
after = {n: read(os.path.join(plots, n)) for n in os.listdir(plots)}
check(after == before, "every file of the earlier plot keeps its bytes, and none is added: %s"
      % sorted(set(after) ^ set(before) | {n for n in before if after.get(n) != before[n]}))
check(not leftovers(plots), "no temporary left in the plot directory")

print("%d passed, %d failed" % (passed, failures))
sys.exit(1 if failures else 0)
