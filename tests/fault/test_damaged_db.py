"""Damaged tuning databases never crash the host process.

From a real database tuned on the CPU, builds a corpus of damaged copies:
named faults (missing, empty, zeroed header, not SQLite, newer schema,
read-only, locked two ways, binaries that do not load, a source that does not
match its hash, a wrong kernel name, a damaged binary cache) and a fuzzed part
(truncation at many offsets, random bytes flipped anywhere in the file, random
bytes flipped inside the stored binaries). For each it runs

  - `attnres run --db FILE` (and with --require-exact for the named faults),
  - plan_probe FILE: planning through the API, every plan checked against the
    fp64 reference,
  - plan_probe on an intact copy that is damaged in place after planning: the
    plans made before must still run correctly,

and asserts that none is killed by a signal or hangs, and that each answer is
either a clear error (exit 1 with a message; no output file) or the documented
fallback (exit 0 and output equal to the reference). Named faults also check
which of the two it is.

Usage: test_damaged_db.py ATTNRES_CLI PLAN_PROBE WORKDIR [--quick]
Standard library only. Runs one probe under valgrind when it is installed.
"""

import os
import random
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
import npyio  # noqa: E402
import reference  # noqa: E402

CLI, PROBE, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
QUICK = "--quick" in sys.argv
D, N, T = 64, 3, 16
TIMEOUT = 120

failures = []
counts = {"cases": 0, "runs": 0, "ok": 0, "refused": 0}
counts_lock = threading.Lock()  # checks may run on threads (full_case)


def bump(key):
    with counts_lock:
        counts[key] += 1


def P(*parts):
    return os.path.join(WORK, *parts)


def env_with_cache(cache):
    e = dict(os.environ)
    e["ATTNRES_CACHE_DIR"] = cache
    return e


def run(cmd, cache, timeout=TIMEOUT):
    """Runs cmd; returns (returncode, stdout, stderr). A signal is negative."""
    bump("runs")
    try:
        r = subprocess.run(cmd, env=env_with_cache(cache), capture_output=True, text=True, timeout=timeout,
                           errors="replace")
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return "timeout", "", ""


def signal_name(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return str(rc)


# ---- the intact database and the inputs ----------------------------------

shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(P("cases"))
os.makedirs(P("cache"))
with open(P("problems.txt"), "w") as f:
    f.write(f"mix f32 {D} {N} 1 replace 0 1,{T}\n")
rc, out, err = run([CLI, "tune", "--device", "cpu", "--problems", P("problems.txt"), "--db", P("base.db"),
                    "--strategy", "random", "--budget", "2", "--quiet"], P("cache", "tune"), timeout=600)
if rc != 0:
    sys.exit(f"cannot tune the base database (exit {rc}): {err}")
# Fold the WAL into the file so that a copy of the file alone is complete.
con = sqlite3.connect(P("base.db"))
con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
con.close()
for ext in ("-wal", "-shm"):
    if os.path.exists(P("base.db") + ext):
        os.remove(P("base.db") + ext)
with open(P("base.db"), "rb") as f:
    BASE = f.read()

rng = random.Random(20240611)
sources = [[[rng.uniform(-1, 1) for _ in range(D)] for _ in range(T)] for _ in range(N)]
query = [rng.uniform(-0.25, 0.25) for _ in range(D)]
npyio.write_f32(P("s.npy"), (N, T, D), [x for src in sources for row in src for x in row])
npyio.write_f32(P("w.npy"), (D,), query)
REF, _ = reference.mix(sources, query)


def output_matches(path):
    shape, vals = npyio.read_f32(path)
    if shape != (T, D):
        return f"output shape {shape}"
    num = sum((vals[t * D + k] - REF[t][k]) ** 2 for t in range(T) for k in range(D))
    den = sum(REF[t][k] ** 2 for t in range(T) for k in range(D))
    e = (num / den) ** 0.5
    return None if e <= 1e-5 else f"relative error {e:.3g} against the reference"


# ---- checks --------------------------------------------------------------

def fail(case, what):
    failures.append(f"{case}: {what}")
    print(f"FAIL {case}: {what}", flush=True)


def check_cli(case, db, cache, extra=(), expect=None, needle=None):
    """attnres run: exit 0 with the right output, or exit 1 with a message
    and no output. expect: None (either), "ok" or "error"; needle: text the
    message must contain."""
    out = P("cases", case + ".out.npy")
    if os.path.exists(out):
        os.remove(out)
    rc, stdout, stderr = run([CLI, "run", "--device", "cpu", "--db", db, "--sources", P("s.npy"),
                              "--query", P("w.npy"), "--out", out, *extra], cache)
    label = "attnres run" + (" " + " ".join(extra) if extra else "")
    if rc == "timeout":
        return fail(case, f"{label} hung")
    if rc < 0 or rc >= 128:
        return fail(case, f"{label} crashed: {signal_name(rc) if rc < 0 else rc}")
    if rc == 0:
        bump("ok")
        if expect == "error":
            return fail(case, f"{label} succeeded where a clear error was expected")
        if not os.path.exists(out):
            return fail(case, f"{label} exit 0 without an output")
        bad = output_matches(out)
        if bad:
            return fail(case, f"{label} fell back to a wrong result: {bad}")
    elif rc == 1:
        bump("refused")
        if expect == "ok":
            return fail(case, f"{label} failed where the fallback was expected: {stderr.strip()}")
        msg = stderr.strip()
        if len(msg) < 10:
            return fail(case, f"{label} failed without a clear message: {msg!r}")
        if needle and needle.lower() not in msg.lower():
            return fail(case, f"{label} message does not say '{needle}': {msg}")
        if os.path.exists(out):
            return fail(case, f"{label} failed but wrote an output")
    else:
        return fail(case, f"{label} exit {rc}: {stderr.strip()}")


def check_probe(case, db, cache, extra=(), expect=None, needle=None):
    """plan_probe: 0 correct plans, 3 clean refusals; 1 is a defect."""
    rc, stdout, stderr = run([PROBE, db, "--d", str(D), "--n", str(N), *extra], cache)
    label = "plan_probe" + (" " + " ".join(os.path.basename(x) for x in extra) if extra else "")
    if rc == "timeout":
        return fail(case, f"{label} hung")
    if rc < 0 or rc >= 128:
        return fail(case, f"{label} crashed: {signal_name(rc) if rc < 0 else rc}")
    if rc == 1:
        return fail(case, f"{label} found a defect:\n{stdout}{stderr}")
    if rc not in (0, 3):
        return fail(case, f"{label} exit {rc}: {stdout}{stderr}")
    if expect == "ok" and rc != 0:
        return fail(case, f"{label} refused where plans were expected:\n{stdout}")
    if expect == "error" and rc != 3:
        return fail(case, f"{label} planned where a refusal was expected:\n{stdout}")
    if needle and needle.lower() not in stdout.lower():
        return fail(case, f"{label} does not say '{needle}':\n{stdout}")
    return stdout


def write_case(case, data):
    path = P("cases", case + ".db")
    with open(path, "wb") as f:
        f.write(data)
    return path


def sql_case(case, *statements):
    """A copy of the intact database changed with SQL."""
    path = write_case(case, BASE)
    con = sqlite3.connect(path)
    for s in statements:
        if isinstance(s, tuple):
            con.execute(*s)
        else:
            con.execute(s)
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path


def full_case(case, db, expect_cli=None, needle=None, exact_expect=None, exact_needle=None, damage=True,
              together=False):
    """Every check on one damaged database, each with a cold binary cache so
    that stored binaries are really read from it. together: the checks run
    at the same time (each of its own cache), for a case whose every check
    waits out the database's busy timeout."""
    counts["cases"] += 1
    cache = P("cache", case)
    checks = [lambda: check_cli(case, db, cache, expect=expect_cli, needle=needle)]
    if exact_expect or exact_needle:
        checks.append(lambda: check_cli(case, db, cache + "-x", extra=("--require-exact",), expect=exact_expect,
                                        needle=exact_needle))
    checks.append(lambda: check_probe(case, db, cache + "-p", expect=expect_cli, needle=needle))
    if together:
        threads = [threading.Thread(target=c) for c in checks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for c in checks:
            c()
    if damage and os.path.isfile(db):
        victim = P("cases", case + ".victim.db")
        with open(victim, "wb") as f:
            f.write(BASE)
        check_probe(case + " (damaged after planning)", victim, cache + "-d", extra=("--damage-with", db))


# ---- the intact database works, exactly ------------------------------------

counts["cases"] += 1
check_cli("intact", P("base.db"), P("cache", "intact"), extra=("--require-exact",), expect="ok")
out = check_probe("intact", P("base.db"), P("cache", "intact"), expect="ok")
if out and "problem 0 at level exact" not in out:
    fail("intact", f"the tuned problem was not planned exactly:\n{out}")

# ---- named faults ------------------------------------------------------------

full_case("missing", P("cases", "no-such.db"), "error", "no such database", damage=False)
full_case("empty-file", write_case("empty-file", b""), "error", "not an attnres database")
full_case("zeroed-header", write_case("zeroed-header", bytes(100) + BASE[100:]), "error")
full_case("not-sqlite", write_case("not-sqlite", b"this is not a database\n" * 200), "error")
full_case("directory", P("cache"), "error", "directory", damage=False)
full_case("newer-schema", sql_case("newer-schema", "PRAGMA user_version = 999"), "error", "newer")
full_case("no-schema", sql_case("no-schema", "DROP TABLE winners"), "error")

# Read-only: the runtime only reads, so a read-only file (and directory)
# plans exactly as the intact one.
ro = write_case("read-only", BASE)
os.chmod(ro, 0o444)
full_case("read-only", ro, "ok", exact_expect="ok", damage=False)
os.makedirs(P("ro-dir"), exist_ok=True)
shutil.copy(P("base.db"), P("ro-dir", "t.db"))
os.chmod(P("ro-dir", "t.db"), 0o444)
os.chmod(P("ro-dir"), 0o555)
full_case("read-only-directory", P("ro-dir", "t.db"), "ok", damage=False)
os.chmod(P("ro-dir"), 0o755)


def locked_case(case, setup_sql, lock_sql):
    """Another process holds a lock on the file while we plan."""
    path = sql_case(case, *setup_sql)
    locker = subprocess.Popen(["sqlite3", path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    locker.stdin.write(lock_sql + "\nSELECT 'locked';\n")
    locker.stdin.flush()
    line = ""
    while line is not None and "locked" not in line:
        line = locker.stdout.readline() or None
    if line is None:
        fail(case, f"the locker did not take its lock: {locker.stderr.read()!r}")
    t0 = time.time()
    full_case(case, path, damage=False, together=True)
    print(f"  {case}: {time.time() - t0:.1f} s with the lock held", flush=True)
    locker.stdin.close()
    locker.wait(timeout=30)


if shutil.which("sqlite3"):
    # A rollback-journal file with a writer holding EXCLUSIVE: readers get
    # "database is locked" after the busy timeout.
    locked_case("locked-exclusive", ["PRAGMA journal_mode = DELETE"],
                "BEGIN EXCLUSIVE; UPDATE runs SET status = status;")
    # A WAL file opened in exclusive locking mode by another process.
    locked_case("locked-wal-exclusive-mode", [],
                "PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; UPDATE runs SET status = status;")
else:
    print("  (sqlite3 command line not found: lock cases skipped)")

# Stored binaries that do not load (refused by their SHA-256 seal before
# they reach dlopen): the runtime compiles the winner from its hash-checked
# source instead, so the plan stays exact, even when exactness is required.
blobs = sqlite3.connect(P("base.db")).execute("SELECT build_key, length(blob) FROM binaries").fetchall()
if not blobs:
    sys.exit("the base database holds no binaries")
for name, expr in [("blob-garbage", "randomblob(length(blob))"),
                   ("blob-truncated", "substr(blob, 1, length(blob) / 2)"),
                   ("blob-zero-header", "zeroblob(64) || substr(blob, 65)"),
                   ("blob-empty", "x''"),
                   ("blob-not-elf", "CAST('#!/bin/sh' AS BLOB) || substr(blob, 10)"),
                   ("blob-unsealed", "substr(blob, 1, length(blob) - 81)")]:
    full_case(name, sql_case(name, f"UPDATE binaries SET blob = {expr}"), "ok", exact_expect="ok")
# A source that does not match its hash is never compiled. While the
# sealed binary is intact it is not needed (the plan stays exact); with the
# binary damaged too, the level is unusable: the plan falls back, and an
# exact match is refused.
full_case("source-hash-mismatch",
          sql_case("source-hash-mismatch", "UPDATE candidates SET source = source || '\n/* tampered */'"),
          "ok", exact_expect="ok")
full_case("source-and-blob-damaged",
          sql_case("source-and-blob-damaged", "UPDATE candidates SET source = source || '\n/* tampered */'",
                   "UPDATE binaries SET blob = randomblob(length(blob))"),
          "ok", exact_expect="error", exact_needle="does not match its hash")
full_case("source-hash-damaged", sql_case("source-hash-damaged", "UPDATE candidates SET source_hash = 'zz'"),
          "ok", exact_expect="error", exact_needle="hash")
full_case("kernel-name-wrong", sql_case("kernel-name-wrong", "UPDATE candidates SET kernel_name = 'nope'"),
          "ok", exact_expect="error")


# The binary cache damaged (the database intact): a cache file that does not
# load is replaced from the database, and the plan stays exact.
def cache_case(case, damage):
    counts["cases"] += 1
    cache = P("cache", case)
    check_probe(case + " (warming)", P("base.db"), cache, expect="ok")
    files = [f for f in os.listdir(cache) if not f.endswith(".tmp")]
    if not files:
        return fail(case, "the warm cache holds no binaries")
    for f in files:
        path = os.path.join(cache, f)
        with open(path, "rb") as fh:
            data = fh.read()
        with open(path, "wb") as fh:
            fh.write(damage(data))
    out = check_probe(case, P("base.db"), cache, expect="ok")
    if out and "problem 0 at level exact" not in out:
        fail(case, f"a damaged cache file cost the exact plan:\n{out}")
    check_cli(case, P("base.db"), cache, extra=("--require-exact",), expect="ok")


cache_case("cache-truncated", lambda b: b[: len(b) // 3])
cache_case("cache-garbage", lambda b: bytes(random.Random(len(b)).getrandbits(8) for _ in b))
cache_case("cache-empty", lambda b: b"")

# ---- fuzzed corpus ---------------------------------------------------------

size = len(BASE)
page = int.from_bytes(BASE[16:18], "big") or 65536
offsets = sorted({0, 1, 16, 99, 100, 101, 512, page - 1, page, page + 1, 2 * page, 3 * page + 7, size // 2,
                  size - page, size - 1} | {rng.randrange(1, size) for _ in range(6 if QUICK else 20)})
for off in offsets:
    if 0 <= off < size:
        full_case(f"truncated-{off}", write_case(f"truncated-{off}", BASE[:off]))

for i in range(12 if QUICK else 50):
    data = bytearray(BASE)
    for _ in range(rng.choice([1, 2, 4, 16, 64])):
        pos = rng.randrange(size) if i % 3 else rng.randrange(100, size)  # a third spare the header
        data[pos] ^= 1 << rng.randrange(8)
    full_case(f"flipped-{i}", write_case(f"flipped-{i}", bytes(data)))

# Bytes flipped inside the stored binaries themselves, where SQLite cannot
# notice: the runtime must not load them blindly.
for i in range(6 if QUICK else 20):
    case = f"blob-flipped-{i}"
    path = write_case(case, BASE)
    con = sqlite3.connect(path)
    for key, _ in blobs:
        (blob,) = con.execute("SELECT blob FROM binaries WHERE build_key = ?", (key,)).fetchone()
        blob = bytearray(blob)
        for _ in range(rng.choice([1, 4, 32])):
            blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        con.execute("UPDATE binaries SET blob = ? WHERE build_key = ?", (bytes(blob), key))
    con.commit()
    con.close()
    full_case(case, path, damage=False)

# ---- valgrind: one clean-refusal path and one fallback path ---------------
# (The fallback case ends on the built-in kernels: kernels compiled with
# -march=native may use instructions valgrind does not know.)

if shutil.which("valgrind") and not QUICK:
    for case in ("truncated-" + str(page), "source-and-blob-damaged"):
        db = P("cases", case + ".db")
        if not os.path.exists(db):
            continue
        rc, stdout, stderr = run(["valgrind", "-q", "--error-exitcode=99", "--leak-check=no", PROBE, db,
                                  "--d", str(D), "--n", str(N)], P("cache", case + "-vg"), timeout=600)
        if rc not in (0, 3):
            fail(case, f"valgrind reports errors (exit {rc}):\n{stderr[-3000:]}")
        else:
            print(f"  valgrind clean on {case} (exit {rc})", flush=True)

print(f"{counts['cases']} damaged databases, {counts['runs']} runs: {counts['ok']} command runs fell back "
      f"or succeeded correctly, {counts['refused']} refused with a message; {len(failures)} failure(s)")
if failures:
    print("failures:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("PASS")
