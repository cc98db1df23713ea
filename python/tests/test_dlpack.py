"""Both DLPack ABIs: the versioned capsules of DLPack 1.0, asked for with
__dlpack__(max_version=(1, 0)), whose read-only and is-copied flags are
honoured for the arrays a call writes, and the legacy capsules of producers
that do not take max_version."""

import numpy as np
import pytest

import attnres
import handmade_dlpack

D, N, T = 16, 3, 4

NUMPY_VERSIONED = tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 1)
needs_versioned_numpy = pytest.mark.skipif(
    not NUMPY_VERSIONED, reason=f"NumPy {np.__version__} has no DLPack 1.0 export (max_version needs NumPy >= 2.1)")

_get_name = handmade_dlpack.capsule_name


class Keeping:
    """Exports a NumPy array through NumPy's own __dlpack__, keeping the
    keywords it was called with and the capsule it returned."""

    def __init__(self, array):
        self.array, self.calls, self.capsules = array, [], []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        capsule = self.array.__dlpack__(**kw)
        self.capsules.append(capsule)
        return capsule


class Legacy(Keeping):
    """A producer from before DLPack 1.0: __dlpack__ takes only stream, and
    NumPy gives its legacy capsule."""

    def __dlpack__(self, stream=None):
        return super().__dlpack__()


@pytest.fixture
def plan(dev):
    return attnres.Plan(dev, None, dtype="f32", d=D, n=N)


@pytest.fixture
def arrays(rng):
    return rng.standard_normal((N, T, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32)


@needs_versioned_numpy
def test_versioned_capsules_are_asked_for_and_consumed(plan, arrays):
    src, q = (Keeping(a) for a in arrays)
    out = Keeping(np.full((T, D), np.nan, np.float32))
    assert plan.mix(src, q, out=out) is out
    for producer in (src, q, out):
        assert producer.calls == [{"max_version": (1, 0)}]
        assert _get_name(producer.capsules[0]) == b"used_dltensor_versioned"
    np.testing.assert_array_equal(out.array, plan.mix(*arrays))


def test_legacy_producers_fall_back_to_the_unversioned_capsule(plan, arrays):
    src, q = (Legacy(a) for a in arrays)
    out = Legacy(np.full((T, D), np.nan, np.float32))
    plan.mix(src, q, out=out)
    for producer in (src, q, out):
        assert producer.calls == [{}]
        assert _get_name(producer.capsules[0]) == b"used_dltensor"
    np.testing.assert_array_equal(out.array, plan.mix(*arrays))


def test_legacy_and_versioned_sources_in_one_bank(plan, arrays):
    src, q = arrays
    mixed = [Legacy(src[0]), src[1], Legacy(src[2])]
    np.testing.assert_array_equal(plan.mix(mixed, q), plan.mix(src, q))


@needs_versioned_numpy
def test_read_only_inputs_are_read(plan, arrays):
    src, q = (a.copy() for a in arrays)
    src.setflags(write=False)
    q.setflags(write=False)
    np.testing.assert_array_equal(plan.mix(src, q), plan.mix(*arrays))


def test_read_only_inputs_through_the_legacy_abi_are_named(plan, arrays):
    # The legacy ABI cannot say read-only, so NumPy refuses to export.
    src = arrays[0].copy()
    src.setflags(write=False)
    with pytest.raises(ValueError, match="sources cannot be exported through DLPack"):
        plan.mix(Legacy(src), arrays[1])


@needs_versioned_numpy
def test_read_only_outputs_are_refused(dev, plan, arrays, rng):
    out = np.full((T, D), 7.0, np.float32)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="out is read-only"):
        plan.mix(*arrays, out=out)
    assert (out == 7.0).all()
    ep = attnres.Plan(dev, None, dtype="f32", d=D, n=N, epilogue=True)
    normed = np.zeros((T, D), np.float32)
    normed.setflags(write=False)
    with pytest.raises(ValueError, match="normed is read-only"):
        ep.mix(*arrays, out_gain=np.ones(D, np.float32), normed=normed)
    p1 = attnres.Plan(dev, None, op="phase1", d=D, n=N, sites=2)
    lse = np.zeros((2, T, 1), np.float32)
    lse.setflags(write=False)
    with pytest.raises(ValueError, match="lse is read-only"):
        p1.phase1(arrays[0], np.ones((2, D), np.float32), lse=lse)


@needs_versioned_numpy
def test_phase2_partial_must_be_writable_only_when_the_add_is_fused(dev, rng):
    o1, b, f = (rng.standard_normal((T, D)).astype(np.float32) for _ in range(3))
    lse = rng.standard_normal((T, 1)).astype(np.float32)
    q = rng.standard_normal(D).astype(np.float32)
    b.setflags(write=False)
    plain = attnres.Plan(dev, None, op="phase2", d=D)
    want = plain.phase2(o1, lse, b.copy(), q)
    np.testing.assert_array_equal(plain.phase2(o1, lse, b, q), want)
    fused = attnres.Plan(dev, None, op="phase2", d=D, fuse_add=True)
    with pytest.raises(ValueError, match="partial is read-only"):
        fused.phase2(o1, lse, b, q, sublayer=f)


# ---- capsules made by hand, as a C library would export them ----------------


def HandMade(array, major=1, minor=0, flags=0):
    return handmade_dlpack.from_numpy(array, major=major, minor=minor, flags=flags)


def test_hand_made_versioned_capsule_is_read(dev, rng):
    p2 = attnres.Plan(dev, None, op="phase2", d=D)
    o1, b = (rng.standard_normal((T, D)).astype(np.float32) for _ in range(2))
    lse = rng.standard_normal((T, 1)).astype(np.float32)
    q = rng.standard_normal(D).astype(np.float32)
    out = np.full((T, D), np.nan, np.float32)
    p2.phase2(HandMade(o1, minor=3), lse, b, q, out=HandMade(out))
    np.testing.assert_array_equal(out, p2.phase2(o1, lse, b, q))


def test_a_later_dlpack_major_version_is_refused(dev, rng):
    p2 = attnres.Plan(dev, None, op="phase2", d=D)
    a = rng.standard_normal((T, D)).astype(np.float32)
    with pytest.raises(ValueError, match=r"o1 was exported as DLPack 2\.0, which this package cannot read"):
        p2.phase2(HandMade(a, major=2), np.zeros((T, 1), np.float32), a.copy(), np.ones(D, np.float32))


@pytest.mark.parametrize("flags, match", [(1, "out is read-only"), (2, "out was exported as a copy")])
def test_flags_of_a_hand_made_output_are_honoured(dev, rng, flags, match):
    p2 = attnres.Plan(dev, None, op="phase2", d=D)
    a = rng.standard_normal((T, D)).astype(np.float32)
    out = np.full((T, D), 7.0, np.float32)
    with pytest.raises(ValueError, match=match):
        p2.phase2(a, np.zeros((T, 1), np.float32), a.copy(), np.ones(D, np.float32), out=HandMade(out, flags=flags))
    assert (out == 7.0).all()
    # The same flags on an input are no obstacle: inputs are only read.
    p2.phase2(HandMade(a, flags=flags), np.zeros((T, 1), np.float32), a.copy(), np.ones(D, np.float32))


def test_something_that_is_not_a_capsule_is_named(plan, arrays):
    class NotACapsule:
        def __dlpack__(self, **kw):
            return object()

    with pytest.raises(ValueError, match="query.__dlpack__\\(\\) did not return an unused"):
        plan.mix(arrays[0], NotACapsule())


def test_capsules_themselves_are_taken_once(plan, arrays):
    # What torch.utils.dlpack.to_dlpack returns (attnres.torch passes those):
    # a capsule is consumed like the one __dlpack__ returns, and only once.
    src, q = arrays
    out = np.full((T, D), np.nan, np.float32)
    caps = [src.__dlpack__(), q.__dlpack__(), out.__dlpack__()]
    plan.mix(caps[0], caps[1], out=caps[2])
    np.testing.assert_array_equal(out, plan.mix(src, q))
    assert [_get_name(c) for c in caps] == [b"used_dltensor"] * 3
    with pytest.raises(ValueError, match="query is a capsule but not an unused 'dltensor_versioned' or 'dltensor' one"):
        plan.mix(src, caps[1])
    bank = [a.__dlpack__() for a in src]
    np.testing.assert_array_equal(plan.mix(bank, q), plan.mix(src, q))
