"""Shared fixtures: the CPU device and the project's fp64 reference
(tests/cli/reference.py, an implementation of DESIGN §1 independent of the
library), imported by path so that there is one oracle for C and Python."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "cli"))
import reference  # noqa: E402

import attnres  # noqa: E402


@pytest.fixture(scope="session")
def dev():
    with attnres.open_device("cpu") as d:
        yield d


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def rel_err(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    den = math.sqrt(float((want * want).sum())) or 1.0
    return math.sqrt(float(((got - want) ** 2).sum())) / den


def tolist(a):
    return None if a is None else np.asarray(a, dtype=np.float64).tolist()


# DESIGN §1: fp32 to 1e-5, 16-bit storage to 1e-2 against the reference of
# the rounded inputs.
TOL = {"f32": 1e-5, "f16": 1e-2, "bf16": 1e-2}


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="session")
def tuned_db(tmp_path_factory):
    """A small real tuning database, made with the project's command line
    (ATTNRES_CLI, else build/bin/attnres): one problem, two candidates."""
    cli = os.environ.get("ATTNRES_CLI", os.path.join(REPO, "build", "bin", "attnres"))
    if not os.access(cli, os.X_OK):
        pytest.skip(f"the attnres command line is not built ({cli}): no tuned database to plan from")
    d = tmp_path_factory.mktemp("db")
    (d / "p.txt").write_text("mix f32 128 3 1 replace 0 33\n")
    subprocess.run([cli, "tune", "--device", "cpu", "--problems", str(d / "p.txt"), "--db", str(d / "t.db"),
                    "--strategy", "random", "--budget", "2", "--quiet"], check=True, capture_output=True)
    return str(d / "t.db")
