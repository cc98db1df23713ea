#!/usr/bin/env python3
"""I/O errors at every write point, as SQLite's test VFS injects them.

Each command that writes a file runs under the preloaded library iofault.c
with its Nth counted call failing (EIO or ENOSPC), for N = 1, 2, ... until
a run reaches no fault, so that every write point of the command fails
once; then once with every call failing. After each failure:

- a command that writes a user's file (db export, db plot, run's .npy,
  the database through db note, import, merge and tune) exits non-zero
  with a message naming the error, and leaves what the user had as it
  was: an output file byte-identical (or, where the message says so,
  whole and new), the database passing integrity_check with its winners;
- the runtime's hot path (the miss file, the kernel cache when a plan
  stores what it loaded) does not fail the run: attnres.h promises that
  the miss file never fails a run and the cache is only a cache, so the
  run exits 0 with the right output, and a cache entry is whole or absent;
- the next run without the fault succeeds with the right result.

Then the same commands on a full disk: a small tmpfs (in a mount namespace
of its own) and RLIMIT_FSIZE with SIGXFSZ ignored (write gets EFBIG).

Usage: test_io_errors.py ATTNRES LIBIOFAULT [--full-disk-inside DIR]
"""

import glob
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
import npyio  # noqa: E402

CLI, SHIM = sys.argv[1], sys.argv[2]
passed = failed = 0
ERRNO_TEXT = {"EIO": "Input/output error", "ENOSPC": "No space left on device", "EFBIG": "File too large"}
MAX_N = 400  # no command here makes more counted calls than this


def ok(what):
    global passed
    passed += 1
    print("ok   " + what)


def bad(what, detail=""):
    global failed
    failed += 1
    print("FAIL " + what)
    for line in detail.strip().splitlines()[-12:]:
        print("     | " + line)


def check(cond, what, detail=""):
    if cond:
        ok(what)
    else:
        bad(what, detail)
    return cond


def run(args, env=None, fault=None, preexec=None):
    """Runs the CLI; fault is a dict of IOFAULT_ settings. Returns
    (rc, stdout, stderr, fired lines, counted calls)."""
    e = dict(os.environ)
    e.update(env or {})
    log = None
    if fault:
        fd, log = tempfile.mkstemp(prefix="iofault-log-", dir=scratch)
        os.close(fd)
        e.update({"LD_PRELOAD": SHIM, "IOFAULT_LOG": log})
        e.update({"IOFAULT_" + k: str(v) for k, v in fault.items()})
        e.pop("IOFAULT_OWNER", None)
    p = subprocess.run([CLI] + args, env=e, capture_output=True, text=True, timeout=300, preexec_fn=preexec)
    fired, counted = [], None
    if log:
        for line in open(log).read().splitlines():
            if line.startswith("fired"):
                fired.append(line)
            elif line.startswith("counted"):
                counted = int(line.split()[1])
        os.unlink(log)
    return p.returncode, p.stdout, p.stderr, fired, counted


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def leftovers(d):
    """Temporaries a failed write left behind."""
    return [f for f in os.listdir(d) if ".tmp" in f]


def db_state(path):
    """(integrity_check, winners) of a database."""
    c = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    try:
        integrity = c.execute("pragma integrity_check").fetchone()[0]
        winners = c.execute("select run_id, problem_id, device_id, candidate_id from winners order by 1, 2, 3").fetchall()
        notes = c.execute("select count(*) from runs").fetchone()[0]
    finally:
        c.close()
    return integrity, winners, notes


# SQLite reports a failed read, write or sync by its own names, without
# the system's reason; and where the database cannot be opened for writing
# it opens it read-only, so that the first write is refused as such.
SQLITE_IO_TEXT = ("disk I/O error", "database or disk is full", "unable to open database file")


def names_error(err, errno_name, op, database):
    if ERRNO_TEXT[errno_name] in err:
        return True
    if database and any(t in err for t in SQLITE_IO_TEXT):
        return True
    return database and op == "open" and "readonly database" in err


def sweep(name, args, pattern, check_after, user_file=True, ops=("write", "sync", "truncate", "open", "close", "rename"),
          errnos=("EIO", "ENOSPC"), env=None, ns=None, prepare=None, database=False):
    """Fails every counted call of each kind in turn (N = 1, 2, ... until
    none fires; or the Ns given), then every call at once. check_after(rc,
    err) checks the state after a run and returns a description of what is
    wrong, or None. A database command may exit 0 under a fault that came
    after its commit (a checkpoint at close: the data are in the WAL);
    check_after then checks that its change is there."""
    runs = problems = reached = 0
    for op in ops:
        for errno_name in errnos:
            n_list = list(ns) if ns else range(1, MAX_N + 1)
            plan = [(n, 0) for n in n_list] + [(1, 1)]
            for n, persist in plan:
                if prepare:
                    prepare()
                rc, out, err, fired, counted = run(args, env, {"PATH": pattern, "OP": op, "ERRNO": errno_name,
                                                               "NTH": n, "PERSIST": persist})
                runs += 1
                where = "%s: %s %s call %d%s" % (name, errno_name, op, n, " on" if persist else "")
                if not fired:
                    if rc != 0:
                        bad(where + ": failed with no fault fired (exit %d)" % rc, err)
                        problems += 1
                    if persist or ns:
                        continue
                    break  # past the last counted call: every write point was hit
                reached += 1
                wrong = None
                if rc < 0 or rc >= 128:
                    wrong = "crashed (exit %d)" % rc
                elif user_file and not database and rc == 0 and op in ("write", "sync", "rename", "open"):
                    wrong = "exit 0 although the %s failed" % op
                elif not user_file and rc != 0:
                    wrong = "the run failed (exit %d), which the hot path must never do" % rc
                elif rc != 0 and not names_error(err, errno_name, op, database):
                    wrong = "the message does not name the error (%s)" % ERRNO_TEXT[errno_name]
                if not wrong:
                    wrong = check_after(rc, err)
                if wrong:
                    bad(where + ": " + wrong, out + err + "\n" + "\n".join(fired))
                    problems += 1
    if reached == 0:
        # A sweep whose fault never fires tests nothing: the library did not
        # load, or the command no longer writes where the test looks.
        bad("%s: no fault was reached in %d runs" % (name, runs))
    elif problems == 0:
        ok("%s: %d faulted runs, every one failed cleanly%s" % (name, reached, "" if user_file else " (the run went on)"))


# ---------------------------------------------------------------------------
def setup():
    """One tuned database, inputs, and the outputs of unfaulted runs."""
    global base_db, env, ref_out, ref_fallback
    env = {"ATTNRES_CACHE_DIR": os.path.join(scratch, "cache")}
    tune_env = {"ATTNRES_CACHE_DIR": os.environ.get("ATTNRES_TEST_KERNEL_CACHE", env["ATTNRES_CACHE_DIR"])}
    with open(os.path.join(scratch, "p.txt"), "w") as f:
        f.write("mix f32 64 3 1 replace 0 16\n")
    base_db = os.path.join(scratch, "base.db")
    rc, out, err, _, _ = run(["tune", "--device", "cpu", "--problems", os.path.join(scratch, "p.txt"), "--shard", "0/8",
                              "--db", base_db, "--quiet"], tune_env)
    if rc != 0:
        bad("tuning the test's database", out + err)
        sys.exit(1)
    sqlite3.connect(base_db).execute("pragma wal_checkpoint(truncate)").close()
    T, N, d = 16, 3, 64
    npyio.write_f32(os.path.join(scratch, "s.npy"), (N, T, d), [((i * 37) % 101 - 50) / 25.0 for i in range(N * T * d)])
    npyio.write_f32(os.path.join(scratch, "w.npy"), (d,), [((i * 13) % 17 - 8) / 8.0 for i in range(d)])
    npyio.write_f32(os.path.join(scratch, "s2.npy"), (2, T, 32), [((i * 7) % 23 - 11) / 9.0 for i in range(2 * T * 32)])
    npyio.write_f32(os.path.join(scratch, "w2.npy"), (32,), [((i * 5) % 7 - 3) / 4.0 for i in range(32)])
    ref_out = os.path.join(scratch, "ref.npy")
    rc, out, err, _, _ = run(run_args(ref_out), env)
    ref_fallback = os.path.join(scratch, "ref-fallback.npy")
    rc2, out2, err2, _, _ = run(fallback_args(ref_fallback), env)
    if rc or rc2:
        bad("the unfaulted runs", out + err + out2 + err2)
        sys.exit(1)


def run_args(out, db=None):
    return ["run", "--device", "cpu", "--db", db or base_db, "--sources", os.path.join(scratch, "s.npy"),
            "--query", os.path.join(scratch, "w.npy"), "--out", out]


def fallback_args(out):
    """A problem the database has not tuned: the plan falls back and
    records a miss."""
    return ["run", "--device", "cpu", "--db", base_db, "--sources", os.path.join(scratch, "s2.npy"),
            "--query", os.path.join(scratch, "w2.npy"), "--out", out]


def same_result(path, ref):
    return read(path) is not None and read(path) == read(ref)


# ---- a user's files: db export, db plot, run --out --------------------------
def old_or_whole(path, old, new_path, outdir, rc, err, what):
    """What is wrong with a user's file after a write under a fault: None
    when path holds its old bytes, or the new file whole (renamed into
    place; only the directory's sync may have failed, which the command
    says), and no temporary is left in outdir."""
    have = read(path)
    if leftovers(outdir):
        return "temporaries left: %s" % leftovers(outdir)
    if have == old or (have == read(new_path) and (rc == 0 or "was written" in err)):
        return None
    return "the previous %s was lost (%s)" % (what, "absent" if have is None else "%d bytes" % len(have))


def sweep_one_file(label, args, target, old, ref, outdir, what, same):
    """Sweeps the faults over a command that writes the file target, which
    holds old before each run: after each, target is old or the whole of
    what ref holds; after the faults, the command writes it as ref."""

    def reset():
        with open(target, "wb") as f:
            f.write(old)

    def after(rc, err):
        return old_or_whole(target, old, ref, outdir, rc, err, what)

    sweep(label, args, outdir, after, env=env, prepare=reset)
    reset()
    rc, _, err, _, _ = run(args, env)
    check(rc == 0 and same(target, ref), "%s recovers after the faults" % label, err)


def test_output_files():
    outdir = os.path.join(scratch, "outputs")
    os.makedirs(outdir, exist_ok=True)
    target = os.path.join(outdir, "export.json")
    new = os.path.join(scratch, "export-ref.json")
    rc, _, err, _, _ = run(["db", "export", "--json", "--out", new, "--db", base_db], env)
    check(rc == 0, "db export without a fault", err)
    sweep_one_file("db export --out", ["db", "export", "--json", "--out", target, "--db", base_db], target,
                   b"the user's previous export\n", new, outdir, "file", lambda a, b: read(a) == read(b))

    # db plot writes several files into one directory.
    plotdir = os.path.join(scratch, "plots")
    refdir = os.path.join(scratch, "plots-ref")
    rc, _, err, _, _ = run(["db", "plot", "--out", refdir, "--db", base_db], env)
    names = sorted(os.listdir(refdir)) if rc == 0 else []
    check(rc == 0 and names, "db plot without a fault writes %d charts" % len(names), err)

    def reset_plots():
        shutil.rmtree(plotdir, ignore_errors=True)
        os.makedirs(plotdir)
        for n in names:
            with open(os.path.join(plotdir, n), "wb") as f:
                f.write(b"old chart " + n.encode())

    def plot_after(rc, err):
        if leftovers(plotdir):
            return "temporaries left: %s" % leftovers(plotdir)
        for n in names:
            have = read(os.path.join(plotdir, n))
            if have != b"old chart " + n.encode() and have != read(os.path.join(refdir, n)):
                return "%s is neither the old chart nor the new one" % n
        return None

    sweep("db plot --out", ["db", "plot", "--out", plotdir, "--db", base_db], plotdir, plot_after, env=env,
          prepare=reset_plots, errnos=("EIO",))
    reset_plots()
    rc, _, err, _, _ = run(["db", "plot", "--out", plotdir, "--db", base_db], env)
    check(rc == 0 and all(read(os.path.join(plotdir, n)) == read(os.path.join(refdir, n)) for n in names),
          "db plot recovers after the faults", err)

    # run's .npy output.
    out = os.path.join(outdir, "out.npy")
    sweep_one_file("run --out", run_args(out), out, b"\x93NUMPY the user's previous output", ref_out, outdir, "output",
                   same_result)


# ---- the database -----------------------------------------------------------
def test_database():
    dbdir = os.path.join(scratch, "dbs")
    os.makedirs(dbdir, exist_ok=True)
    db = os.path.join(dbdir, "user.db")
    before = db_state(base_db)
    check(before[0] == "ok" and before[1], "the tuned database has %d winners" % len(before[1]))
    export = os.path.join(scratch, "other.json")
    other = os.path.join(scratch, "other.db")
    shutil.copy(base_db, other)
    # Another host's run of the same problem: a new uid, so that import and
    # merge add it.
    c = sqlite3.connect(other)
    c.execute("update runs set uid = lower(hex(randomblob(16))), note = 'from another host'")
    c.commit()
    c.execute("pragma wal_checkpoint(truncate)")
    c.close()
    run(["db", "export", "--json", "--out", export, "--db", other], env)

    def reset():
        for suffix in ("", "-wal", "-shm", "-journal"):
            if os.path.exists(db + suffix):
                os.unlink(db + suffix)
        shutil.copy(base_db, db)

    def db_after(rc, err, effect=None):
        integrity, winners, _ = db_state(db)
        if integrity != "ok":
            return "integrity_check: " + integrity
        if winners[: len(before[1])] != before[1]:
            return "the previous winners are gone"
        if rc == 0 and effect and not effect():
            return "exit 0, but its change is not in the database"
        return None

    def one_run_noted(note):
        """The check that exactly one run of the database has the note."""

        def noted():
            c = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
            try:
                return c.execute("select count(*) from runs where note = ?", (note,)).fetchone()[0] == 1
            finally:
                c.close()

        return noted

    has_other_note = one_run_noted("from another host")
    for name, args, effect in (("db note", ["db", "note", "latest", "faulted", "--db", db], one_run_noted("faulted")),
                               ("db import", ["db", "import", export, "--db", db], has_other_note),
                               ("db merge", ["db", "merge", other, "--db", db], has_other_note)):
        sweep(name + " (the database)", args, db, lambda rc, err: db_after(rc, err, effect), env=env,
              prepare=reset, database=True)
        reset()
        rc, _, err, _, _ = run(args, env)
        check(rc == 0 and db_after(rc, err, effect) is None, name + " recovers after the faults", err)

    # A tune writes the database some hundred times, each run a few seconds
    # (more where it measures the ceilings itself): it fails a sample of its
    # write points.
    with open(os.path.join(scratch, "p2.txt"), "w") as f:
        f.write("mix f32 64 3 1 replace 0 32\n")
    tune = ["tune", "--device", "cpu", "--problems", os.path.join(scratch, "p2.txt"), "--shard", "0/8", "--db", db,
            "--quiet"]
    reset()
    rc, _, err, _, counted = run(tune, env, {"PATH": db, "OP": "write", "NTH": 1000000})
    check(rc == 0 and counted, "tune writes the database %s times" % counted, err)

    sample = sorted({1, 2, 5, 13, 34, 89, max(1, (counted or 2) // 2), max(1, (counted or 1) - 1)})

    def tuned(err):
        # A tune that exits 0 recorded its run whole: complete, with its
        # winner, and no result it could not record.
        c = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
        try:
            status, won = c.execute("select status, (select count(*) from winners w where w.run_id = r.id)"
                                    " from runs r order by id desc limit 1").fetchone()
        finally:
            c.close()
        return status == "complete" and won == 1 and "attnres tune:" not in err

    tune_after = lambda rc, err: db_after(rc, err, lambda: tuned(err))  # noqa: E731
    sweep("tune (the database)", tune, db, tune_after, env=env, prepare=reset, ops=("write",), errnos=("EIO",),
          ns=sample, database=True)
    sweep("tune (the database)", tune, db, tune_after, env=env, prepare=reset, ops=("sync", "truncate"),
          errnos=("ENOSPC",), ns=(1, 2), database=True)
    reset()
    rc, _, err, _, _ = run(tune, env)
    winners = db_state(db)[1]
    check(rc == 0 and db_after(rc, err) is None and len(winners) > len(before[1]),
          "tune recovers after the faults and adds its winner", err)


# ---- the hot path: the kernel cache and the miss file -------------------------
def test_hot_path():
    cache = os.path.join(scratch, "hot-cache")
    ref_cache = os.path.join(scratch, "ref-cache")
    shutil.rmtree(ref_cache, ignore_errors=True)
    out = os.path.join(scratch, "hot.npy")
    rc, _, err, _, _ = run(run_args(out), {"ATTNRES_CACHE_DIR": ref_cache})
    entries = {f: read(os.path.join(ref_cache, f)) for f in os.listdir(ref_cache)} if rc == 0 else {}
    check(rc == 0 and entries, "a run stores the loaded kernel in an empty cache (%d entries)" % len(entries), err)

    def reset():
        shutil.rmtree(cache, ignore_errors=True)

    def cache_after(rc, err):
        if not same_result(out, ref_out):
            return "wrong or no output"
        if os.path.isdir(cache):
            if leftovers(cache):
                return "temporaries left in the cache: %s" % leftovers(cache)
            for f in os.listdir(cache):
                if read(os.path.join(cache, f)) != entries.get(f):
                    return "cache entry %s is not whole" % f
        return None

    sweep("run, storing in the kernel cache", run_args(out), cache, cache_after, user_file=False,
          env={"ATTNRES_CACHE_DIR": cache}, prepare=reset)
    rc, _, err, _, _ = run(run_args(out), {"ATTNRES_CACHE_DIR": cache})
    check(rc == 0 and same_result(out, ref_out) and cache_after(rc, err) is None and
          {f: read(os.path.join(cache, f)) for f in os.listdir(cache)} == entries,
          "the next run fills the cache", err)

    # The miss file: a line of an earlier miss is there; a fallback run under
    # the fault must succeed and keep it.
    missdir = os.path.join(scratch, "miss")
    os.makedirs(missdir, exist_ok=True)
    miss = os.path.join(missdir, "misses.txt")
    rc, _, err, _, _ = run(fallback_args(out), dict(env, ATTNRES_MISS_FILE=miss))
    line = read(miss)
    check(rc == 0 and line and line.count(b"\n") == 1, "a fallback run records its miss", err)
    earlier = line.replace(b"d=32", b"d=48") if line else b""

    def reset_miss():
        with open(miss, "wb") as f:
            f.write(earlier)

    def miss_after(rc, err):
        if not same_result(out, ref_fallback):
            return "wrong or no output"
        have = read(miss) or b""
        if not have.startswith(earlier):
            return "the earlier record was lost"
        rest = have[len(earlier):]
        if rest not in (b"", line):
            return "the record holds %r after the earlier line" % rest
        return None

    sweep("run, recording a miss", fallback_args(out), missdir, miss_after, user_file=False,
          env=dict(env, ATTNRES_MISS_FILE=miss), prepare=reset_miss)
    reset_miss()
    rc, _, err, _, _ = run(fallback_args(out), dict(env, ATTNRES_MISS_FILE=miss))
    check(rc == 0 and read(miss) == earlier + line, "the next run records the miss", err)


# ---- a full disk ------------------------------------------------------------
def ignore_sigxfsz(limit):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def test_file_size_limit():
    """RLIMIT_FSIZE: writes past the limit get EFBIG (SIGXFSZ ignored). The
    limit leaves room for SQLite's 32 KiB shared-memory file, which every
    reader of a WAL database writes."""
    limit = 40 << 10
    d = os.path.join(scratch, "fsize")
    os.makedirs(d, exist_ok=True)
    target = os.path.join(d, "export.json")
    with open(target, "wb") as f:
        f.write(b"old export\n")
    rc, _, err, _, _ = run(["db", "export", "--json", "--out", target, "--db", base_db], env,
                           preexec=ignore_sigxfsz(limit))
    check(rc != 0 and rc < 128 and "File too large" in err and read(target) == b"old export\n"
          and not leftovers(d), "db export past RLIMIT_FSIZE fails naming it, the old file kept (exit %d)" % rc, err)
    # An import of the tuned database of test_database (more candidates,
    # with their sources) into a copy of the first: its WAL outgrows the limit.
    db = os.path.join(d, "user.db")
    shutil.copy(base_db, db)
    before = db_state(db)
    bigger = os.path.join(scratch, "bigger.json")
    rc, _, err, _, _ = run(["db", "export", "--json", "--out", bigger, "--db", os.path.join(scratch, "dbs", "user.db")],
                           env)
    rc, _, err, _, _ = run(["db", "import", bigger, "--db", db], env, preexec=ignore_sigxfsz(limit))
    after = db_state(db)
    check(rc != 0 and rc < 128 and names_error(err, "EFBIG", "write", True) and after[0] == "ok"
          and after[1] == before[1], "db import past RLIMIT_FSIZE fails naming it and keeps the database (exit %d)" % rc,
          err)
    rc, _, err, _, _ = run(["db", "import", bigger, "--db", db], env)
    check(rc == 0 and db_state(db)[0] == "ok" and len(db_state(db)[1]) > len(before[1]),
          "db import recovers without the limit", err)
    # A run with no database (the built-in kernel) whose output is past
    # the limit; its miss goes to a file the limit leaves room for.
    out = os.path.join(d, "out.npy")
    miss = os.path.join(d, "miss.txt")
    rc, _, err, _, _ = run(["run", "--device", "cpu", "--sources", os.path.join(scratch, "s2.npy"),
                            "--query", os.path.join(scratch, "w2.npy"), "--out", out],
                           dict(env, ATTNRES_MISS_FILE=miss), preexec=ignore_sigxfsz(1000))
    check(rc != 0 and rc < 128 and "File too large" in err and not os.path.exists(out) and not leftovers(d),
          "run past RLIMIT_FSIZE fails writing its output, and leaves nothing (exit %d)" % rc, err)
    have = read(miss)
    check(have is None or have == b"" or (have.endswith(b"\n") and have.count(b"\n") == 1),
          "the miss file holds whole lines only", repr(have))


def test_full_tmpfs():
    """A 4 MiB tmpfs filled to the last block, in a mount namespace of
    its own; the test reruns itself inside it."""
    d = os.path.join(scratch, "tmpfs")
    os.makedirs(d, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("skip full tmpfs: needs root and unshare")
        return
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=4m tmpfs '%s'" % d], capture_output=True, text=True)
    if probe.returncode != 0:
        print("skip full tmpfs: cannot mount one here (%s)" % probe.stderr.strip())
        return
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs -o size=4m tmpfs \"$1\" && shift && exec \"$@\"", "sh", d,
                        sys.executable, os.path.abspath(__file__), CLI, SHIM, "--full-disk-inside", d, scratch],
                       capture_output=True, text=True, timeout=300)
    sys.stdout.write(p.stdout)
    global passed, failed
    passed += sum(1 for line in p.stdout.splitlines() if line.startswith("ok "))
    failed += sum(1 for line in p.stdout.splitlines() if line.startswith("FAIL "))
    if p.returncode != 0 and not any(line.startswith("FAIL ") for line in p.stdout.splitlines()):
        bad("the full-tmpfs part exited %d" % p.returncode, p.stderr)


def fill(d):
    """Fills the file system at d to the last byte it takes."""
    with open(os.path.join(d, "filler"), "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0")
        except OSError:
            pass


def inside_full_tmpfs(d):
    target = os.path.join(d, "export.json")
    with open(target, "wb") as f:
        f.write(b"old export\n")
    db = os.path.join(d, "user.db")
    shutil.copy(base_db, db)
    before = db_state(db)
    miss = os.path.join(d, "miss.txt")
    with open(miss, "wb") as f:
        f.write(b"")
    fill(d)
    rc, _, err, _, _ = run(["db", "export", "--json", "--out", target, "--db", base_db], env)
    check(rc != 0 and rc < 128 and "No space left" in err and read(target) == b"old export\n" and not leftovers(d),
          "db export on a full disk fails naming it, the old file kept (exit %d)" % rc, err)
    rc, _, err, _, _ = run(["db", "import", os.path.join(scratch, "other.json"), "--db", db], env)
    after = db_state(db)
    check(rc != 0 and rc < 128 and after[0] == "ok" and after[1] == before[1],
          "db import on a full disk fails and keeps the database (exit %d)" % rc, err)
    out = os.path.join(scratch, "full.npy")
    rc, _, err, _, _ = run(fallback_args(out), dict(env, ATTNRES_MISS_FILE=miss))
    check(rc == 0 and same_result(out, ref_fallback), "a fallback run on a full disk succeeds (exit %d)" % rc, err)
    rc, _, err, _, _ = run(run_args(out), {"ATTNRES_CACHE_DIR": os.path.join(d, "cache")})
    check(rc == 0 and same_result(out, ref_out), "a run whose kernel cache is full succeeds (exit %d)" % rc, err)
    os.unlink(os.path.join(d, "filler"))
    for f in os.listdir(os.path.join(d, "cache")) if os.path.isdir(os.path.join(d, "cache")) else []:
        check(".tmp" not in f, "no temporary left in the cache: " + f)
    rc, _, err, _, _ = run(["db", "export", "--json", "--out", target, "--db", base_db], env)
    check(rc == 0 and read(target) == read(os.path.join(scratch, "export-ref.json")),
          "db export recovers once there is room", err)
    rc, _, err, _, _ = run(["db", "import", os.path.join(scratch, "other.json"), "--db", db], env)
    check(rc == 0 and db_state(db)[0] == "ok", "db import recovers once there is room", err)
    rc, _, err, _, _ = run(fallback_args(out), dict(env, ATTNRES_MISS_FILE=miss))
    have = read(miss) or b""
    check(rc == 0 and have.endswith(b"\n") and have.count(b"attnres-miss 1 ") == 1,
          "the miss is recorded once there is room", repr(have))


def main():
    global scratch
    if len(sys.argv) > 3 and sys.argv[3] == "--full-disk-inside":
        scratch = sys.argv[5]
        global base_db, env, ref_out, ref_fallback
        base_db = os.path.join(scratch, "base.db")
        env = {"ATTNRES_CACHE_DIR": os.path.join(scratch, "cache")}
        ref_out = os.path.join(scratch, "ref.npy")
        ref_fallback = os.path.join(scratch, "ref-fallback.npy")
        inside_full_tmpfs(sys.argv[4])
        sys.exit(1 if failed else 0)
    scratch = tempfile.mkdtemp(prefix="attnres-io-errors-")
    try:
        setup()
        test_output_files()
        test_database()
        test_hot_path()
        test_file_size_limit()
        test_full_tmpfs()
    finally:
        if failed == 0:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print("scratch kept: " + scratch)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
