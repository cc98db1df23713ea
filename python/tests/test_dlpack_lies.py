"""Capsules that lie: every field of a borrowed DLPack tensor is checked
before it is used, and a capsule whose shape, strides, offset, ndim, dtype,
device or data pointer cannot be right is refused with a ValueError that
names the field, and nothing is written.

Before those checks some of these cases crashed the interpreter, so each
case runs in a child process: a crash fails that case, not the session.
One child runs them all; when it dies, the case it died in is recorded and
a new child runs the rest.

    python python/tests/test_dlpack_lies.py CASE...   runs cases in this process
"""

import ctypes
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import handmade_dlpack as hd  # noqa: E402

D, N, T = 16, 3, 4
I64_MIN = -(2**63)


class LegacyManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", hd.DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


def exported(array, **fields):
    """array exported by hand, then each DLTensor field overwritten: shape
    and strides take a tuple (kept alive by the exporter) or None (NULL)."""
    e = hd.from_numpy(array)
    t = e.tensor.dl_tensor
    for key, value in fields.items():
        if key in ("shape", "strides"):
            arr = None if value is None else (ctypes.c_int64 * len(value))(*value)
            setattr(e, "_" + key, arr)
            setattr(t, key, arr)
        elif key == "data_offset":
            t.data = array.ctypes.data + value
        else:
            setattr(t, key, value)
    return e


def legacy(array, **fields):
    """The same as a legacy 'dltensor' capsule, handed over as the capsule
    itself (as torch.utils.dlpack.to_dlpack gives it)."""
    e = exported(array, **fields)
    m = LegacyManaged(e.tensor.dl_tensor, None, None)
    cap = hd._capsule_new(ctypes.addressof(m), b"dltensor", None)
    return cap, (e, m)


def sources():
    return np.random.default_rng(5).standard_normal((N, T, D)).astype(np.float32)


def query():
    return np.ones(D, np.float32)


# name -> (which argument lies, how it is built, what the message says)
CASES = {
    "shape NULL": ("sources", lambda: exported(sources(), shape=None), r"sources: DLPack shape is NULL"),
    "shape NULL, legacy capsule": ("sources", lambda: legacy(sources(), shape=None),
                                   r"sources: DLPack shape is NULL"),
    "byte_offset 2**63": ("sources", lambda: exported(sources(), byte_offset=2**63),
                          r"sources: DLPack byte_offset 9223372036854775808"),
    "byte_offset 2**64 - 1": ("sources", lambda: exported(sources(), byte_offset=2**64 - 1),
                              r"sources: DLPack byte_offset 18446744073709551615"),
    "token stride 2**61": ("sources", lambda: exported(sources(), strides=(T * D, 2**61, 1)),
                           r"sources: DLPack strides\[1\] = 2305843009213693952"),
    "token stride 2**61 in out": ("out", lambda: exported(np.zeros((T, D), np.float32), strides=(2**61, 1)),
                                  r"out: DLPack strides\[0\] = 2305843009213693952"),
    "source stride INT64_MIN": ("sources", lambda: exported(sources(), strides=(I64_MIN, D, 1)),
                                r"sources: DLPack strides\[0\] = -9223372036854775808"),
    "negative strides below address 0": ("sources",
                                         lambda: exported(sources(), strides=(-(2**44), D, 1), data=4096),
                                         r"sources: DLPack strides over shape \(3, 4, 16\) reach beyond"),
    "negative size": ("sources", lambda: exported(sources(), shape=(N, -4, D)), r"sources: DLPack shape\[1\] is -4"),
    "more elements than memory": ("sources", lambda: exported(sources(), shape=(N, 2**62, D)),
                                  r"sources: DLPack shape \(3, 4611686018427387904, 16\) has more elements"),
    "ndim 7": ("sources", lambda: exported(sources(), ndim=7), r"sources must have 3 dimensions, got 7"),
    "ndim -1": ("query", lambda: exported(query(), ndim=-1), r"query must have 1 dimension, got -1"),
    "dtype of 4 lanes": ("sources", lambda: exported(sources(), lanes=4), r"sources: DLPack dtype has 4 lanes"),
    "dtype of 0 bits": ("sources", lambda: exported(sources(), bits=0), r"sources: DLPack dtype has 0 bits"),
    "dtype of 12 bits": ("query", lambda: exported(query(), bits=12), r"query: DLPack dtype has 12 bits"),
    "device_type 0": ("sources", lambda: exported(sources(), device_type=0), r"sources: DLPack device_type 0"),
    "device_type -3": ("sources", lambda: exported(sources(), device_type=-3), r"sources: DLPack device_type -3"),
    "device_id -1": ("sources", lambda: exported(sources(), device_id=-1), r"sources: DLPack device_id -1"),
    "data NULL": ("sources", lambda: exported(sources(), data=None), r"sources: DLPack data is NULL for 192 elements"),
    "data misaligned": ("query", lambda: exported(query(), data_offset=1),
                        r"query: DLPack data \+ byte_offset \(0x[0-9a-f]+\) is not a multiple of the element size 4"),
    "data at the top of memory": ("sources", lambda: exported(sources(), data=2**64 - 64),
                                  r"sources: DLPack strides over shape \(3, 4, 16\) reach beyond"),
}


def run_case(name):
    """Runs one case in this process: (exception type name, message)."""
    import attnres

    which, build, _ = CASES[name]
    dev = attnres.open_device("cpu")
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N)
    args = {"sources": sources(), "query": query(), "out": np.full((T, D), 7.0, np.float32)}
    guard = args["out"]
    lying = build()
    args[which] = lying[0] if isinstance(lying, tuple) else lying.__dlpack__(max_version=(1, 0))
    try:
        plan.mix(args["sources"], args["query"], out=args["out"])
        outcome = ("ok", "accepted")
    except Exception as e:  # noqa: BLE001 - the type is the answer
        outcome = (type(e).__name__ if not isinstance(e, ValueError) else "ValueError", str(e))
    if which != "out" and not (guard == 7.0).all():
        outcome = ("wrote", "a refused call wrote to out")
    return outcome


@pytest.fixture(scope="module")
def outcomes():
    results, pending = {}, list(CASES)
    while pending:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *pending], capture_output=True, text=True,
                              timeout=120)
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                results[r["case"]] = (r["type"], r["message"])
        pending = [c for c in pending if c not in results]
        if pending:
            how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
            results[pending[0]] = ("crash", f"the process died ({how}): {proc.stderr[-2000:]}")
            pending = pending[1:]
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_lying_capsule_is_refused_naming_the_field(case, outcomes):
    kind, message = outcomes[case]
    assert kind == "ValueError", f"{case}: {kind}: {message}"
    assert re.search(CASES[case][2], message), f"{case}: {message!r} does not match {CASES[case][2]!r}"


def test_honest_strides_and_offset_are_read(dev):
    """The checks refuse only lies: explicit strides, a byte offset and a
    size-1 axis with any stride are read as they say."""
    import attnres

    src = sources()
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N)
    want = plan.mix(src, query())
    big = np.zeros((N + 1, T, D), np.float32)
    big[1:] = src
    e = exported(big, shape=(N, T, D), strides=(T * D, D, 1), byte_offset=T * D * 4)
    np.testing.assert_array_equal(plan.mix(e, query()), want)
    one = src[:1]
    plan1 = attnres.Plan(dev, None, dtype="f32", d=D, n=1)
    np.testing.assert_array_equal(plan1.mix(exported(one, strides=(2**62, D, 1)), query()), plan1.mix(one, query()))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        kind, message = run_case(name)
        print(json.dumps({"case": name, "type": kind, "message": message}), flush=True)
