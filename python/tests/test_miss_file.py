"""attnres.miss_file_set: a plan that falls back records its problem once per
T bucket in the named file, in the format `attnres tune --from-misses` reads;
None turns recording off; bad paths are refused by name."""

import numpy as np
import pytest

import attnres

D, N = 64, 3


@pytest.fixture
def miss_file(tmp_path):
    path = tmp_path / "misses.txt"
    attnres.miss_file_set(path)
    yield path
    attnres.miss_file_set(None)


def lines(path):
    return path.read_text().splitlines() if path.exists() else []


def run(plan, T, rng):
    sources = rng.standard_normal((N, T, D)).astype(np.float32)
    q = rng.standard_normal(D).astype(np.float32)
    return plan.mix(sources, q, eps=1e-6)


def test_fallen_back_plan_records_each_bucket_once(dev, miss_file, rng):
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N)
    assert plan.level == "generic"
    assert str(miss_file) in plan.explain()
    run(plan, 3, rng)
    recorded = lines(miss_file)
    assert len(recorded) == 1
    fields = recorded[0].split()
    assert fields[:2] == ["attnres-miss", "1"]
    assert {"op=mix", "dtype=f32", f"d={D}", f"n={N}", "heads=1", "t=4"} <= set(fields)
    run(plan, 4, rng)  # the same bucket (T rounded up to 4): nothing new
    assert lines(miss_file) == recorded
    run(plan, 9, rng)  # bucket 16
    assert len(lines(miss_file)) == 2 and "t=16" in lines(miss_file)[1].split()


def test_none_turns_recording_off(dev, miss_file, rng):
    attnres.miss_file_set(None)
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N + 1)
    run_plan = plan.mix(rng.standard_normal((N + 1, 2, D)).astype(np.float32),
                        rng.standard_normal(D).astype(np.float32), eps=1e-6)
    assert run_plan.shape == (2, D)
    assert lines(miss_file) == []


def test_bad_paths_are_refused():
    with pytest.raises(TypeError):
        attnres.miss_file_set(42)
    with pytest.raises(ValueError):
        attnres.miss_file_set("a\0b")
    with pytest.raises(attnres.ArgumentError, match="4096"):
        attnres.miss_file_set("x" * 5000)
