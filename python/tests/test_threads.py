"""Several threads run plans at once (the GIL is released while a kernel
runs); every result matches a single-threaded run, and a plan closed while
other threads use it is released only after they are done."""

import threading

import numpy as np

import attnres

D, N, T = 64, 5, 33


def test_threads_running_plans_at_once(dev):
    rng = np.random.default_rng(7)
    plans = [attnres.Plan(dev, None, d=D, n=N, heads=h) for h in (1, 2, 4, 8)]
    cases = []
    for i in range(8):
        plan = plans[i % len(plans)]
        src = rng.standard_normal((N, T, D)).astype(np.float32)
        q = rng.standard_normal(D).astype(np.float32)
        cases.append((plan, src, q, plan.mix(src, q)))
    errors = []
    barrier = threading.Barrier(len(cases))

    def worker(plan, src, q, want):
        try:
            barrier.wait()
            out = np.empty((T, D), np.float32)
            for _ in range(200):
                plan.mix(src, q, out=out)
                np.testing.assert_array_equal(out, want)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=c) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_close_while_other_threads_run(dev):
    plan = attnres.Plan(dev, None, d=D, n=N)
    src = np.ones((N, 4096, D), np.float32)
    q = np.ones(D, np.float32)
    started = threading.Event()
    outcomes = []

    def worker():
        started.set()
        try:
            for _ in range(50):
                plan.mix(src, q)
            outcomes.append("ran")
        except ValueError as e:
            outcomes.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    plan.close()
    for t in threads:
        t.join()
    # Each thread either finished or was told the plan is closed; none crashed.
    assert len(outcomes) == 4
    assert all(o in ("ran", "the plan is closed") for o in outcomes)
