"""open_db at odd paths: a database in a read-only directory is read (it is
in WAL mode, and SQLite cannot create its -shm file there), and a FIFO is
refused at once. Each runs in a child process under a timeout, so that a
blocking open fails the test instead of hanging the session."""

import os
import subprocess
import sys

import pytest

import read_only_dir  # tests/cli, on the path through conftest

from conftest import REPO

CHILD_TIMEOUT = 60
EXPORT = os.path.join(REPO, "tests", "fuzz", "corpus", "db_import", "ok-v1-fixture-export.json")


def in_child(code, *args, prefix=()):
    """Runs Python code in a child: (exit status, stdout + stderr)."""
    try:
        r = subprocess.run(list(prefix) + [sys.executable, "-c", code, *args], capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "timeout", f"still running after {CHILD_TIMEOUT} s"
    return r.returncode, r.stdout + r.stderr


def test_open_db_reads_a_database_in_a_read_only_directory(tmp_path):
    cli = os.environ.get("ATTNRES_CLI", os.path.join(REPO, "build", "bin", "attnres"))
    if not os.access(cli, os.X_OK):
        pytest.skip(f"the attnres command line is not built ({cli}): no database to read")
    ro = tmp_path / "ro"
    ro.mkdir()
    db = str(ro / "t.db")
    subprocess.run([cli, "db", "import", EXPORT, "--db", db], check=True, capture_output=True)
    prefix, why = read_only_dir.read_only_prefix(str(ro))
    if prefix is None:
        pytest.skip(f"cannot make a read-only directory here: {why}")
    try:
        status, output = in_child(
            "import sys, attnres\n"
            "with attnres.open_db(sys.argv[1]) as db, attnres.open_device('cpu') as dev:\n"
            "    plan = attnres.Plan(dev, db, dtype='f32', d=256, n=5)\n"
            "    print('planned', plan.level)\n", db, prefix=prefix)
    finally:
        read_only_dir.restore(str(ro))
    assert status == 0 and "planned" in output, output


def test_open_db_refuses_a_fifo_at_once(tmp_path):
    fifo = str(tmp_path / "fifo.db")
    os.mkfifo(fifo)
    status, output = in_child(
        "import sys, attnres\n"
        "try:\n"
        "    attnres.open_db(sys.argv[1])\n"
        "except attnres.Error as e:\n"
        "    print('refused:', e)\n", fifo)
    assert status == 0 and "refused:" in output and "not a regular file" in output, (status, output)
