"""Handles: context managers, close() and use after close, finalizers in any
order, and a plan outliving the handles it was made from."""

import gc
import weakref

import numpy as np
import pytest

import attnres
from conftest import rel_err

D, N, T = 16, 2, 3


def inputs():
    return np.ones((N, T, D), np.float32), np.ones(D, np.float32)


def test_context_managers_close():
    with attnres.open_device("cpu") as dev:
        with attnres.Plan(dev, None, d=D, n=N) as plan:
            plan.mix(*inputs())
        assert plan.closed
        with pytest.raises(ValueError, match="the plan is closed"):
            plan.mix(*inputs())
        with pytest.raises(ValueError, match="the plan is closed"):
            plan.explain()
    assert dev.closed
    with pytest.raises(ValueError, match="the device is closed"):
        attnres.Plan(dev, None, d=D, n=N)
    with pytest.raises(ValueError, match="the device is closed"):
        dev.info


def test_close_is_idempotent():
    dev = attnres.open_device("cpu")
    plan = attnres.Plan(dev, None, d=D, n=N)
    plan.close()
    plan.close()
    dev.close()
    dev.close()


def test_plan_keeps_working_after_its_device_is_closed():
    # The runtime needs plans destroyed before their device: closing the
    # device only marks it, and the last plan releases it.
    dev = attnres.open_device("cpu")
    plan = attnres.Plan(dev, None, d=D, n=N)
    dev.close()
    assert dev.closed
    out = plan.mix(*inputs())
    np.testing.assert_allclose(out, 1.0)
    assert plan.device is dev
    plan.close()
    assert plan.device is None


def test_finalizers_in_either_order():
    dev = attnres.open_device("cpu")
    plan = attnres.Plan(dev, None, d=D, n=N)
    dev_ref = weakref.ref(dev)
    del dev
    gc.collect()
    assert dev_ref() is not None, "the plan must keep its device alive"
    plan.mix(*inputs())
    del plan
    gc.collect()
    assert dev_ref() is None
    # And the other way round: the plan first, then the device.
    dev = attnres.open_device("cpu")
    plan = attnres.Plan(dev, None, d=D, n=N)
    del plan
    del dev
    gc.collect()


def test_database_lifetime(dev, tuned_db):
    db = attnres.open_db(tuned_db)
    plan = attnres.Plan(dev, db, d=128, n=3, require_exact=True)
    assert plan.level == "exact"
    assert "exact device" in plan.explain()
    # Plans keep no database: closing it leaves the plan working.
    db.close()
    with pytest.raises(ValueError, match="the database is closed"):
        attnres.Plan(dev, db, d=128, n=3)
    src = np.random.default_rng(0).standard_normal((3, 40, 128)).astype(np.float32)
    q = np.ones(128, np.float32)
    want = attnres.Plan(dev, None, d=128, n=3).mix(src, q)
    assert rel_err(plan.mix(src, q), want) <= 1e-5
    with attnres.open_db(tuned_db) as db2:
        assert attnres.Plan(dev, db2, d=64, n=3).level == "generic"
    assert db2.closed


def test_explain_and_level(dev):
    plan = attnres.Plan(dev, None, d=D, n=N)
    assert plan.level == "generic"
    text = plan.explain()
    assert "no database given" in text and "built-in generic kernel" in text
    assert plan.problem == {"op": "mix", "dtype": "f32", "d": D, "n": N, "heads": 1, "form": "replace",
                            "epilogue": False, "sites": 0, "fuse_add": False}
    assert "op=mix" in repr(plan)
