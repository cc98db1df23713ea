"""Block AttnRes phase 1 and phase 2 against the fp64 reference, and phase 1
followed by phase 2 against mix over the block sources plus the partial."""

import numpy as np
import pytest

import attnres
from conftest import TOL, reference, rel_err, tolist

D, NB, S, T = 32, 3, 2, 4


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("as_views", [False, True])
def test_phase1_matches_reference(dev, rng, heads, as_views):
    plan = attnres.Plan(dev, None, op="phase1", dtype="f32", d=D, n=NB, heads=heads, sites=S)
    src = rng.standard_normal((NB, T, D)).astype(np.float32)
    qs = rng.standard_normal((S, D)).astype(np.float32)
    gs = (1 + 0.1 * rng.standard_normal((S, D))).astype(np.float32)
    sources = [np.repeat(src[i], 2, axis=0)[::2] for i in range(NB)] if as_views else src
    if as_views:
        assert sources[0].strides[0] == 2 * D * 4
    o1, lse = plan.phase1(sources, qs, gains=gs, eps=1e-5, scale=0.9)
    assert o1.shape == (S, T, D) and lse.shape == (S, T, heads) and lse.dtype == np.float32
    ref_o1, ref_lse = reference.phase1(tolist(src), tolist(qs), tolist(gs), heads, 1e-5, 0.9)
    assert rel_err(o1, ref_o1) <= TOL["f32"]
    assert rel_err(lse, ref_lse) <= TOL["f32"]


def test_phase1_into_given_views(dev, rng):
    plan = attnres.Plan(dev, None, op="phase1", dtype="f32", d=D, n=NB, sites=S)
    src = rng.standard_normal((NB, T, D)).astype(np.float32)
    qs = rng.standard_normal((S, D)).astype(np.float32)
    o1_bank = np.zeros((S, T, 2 * D), np.float32)
    lse_bank = np.zeros((S, T, 1), np.float32)
    o1, lse = plan.phase1(src, qs, out=[o1_bank[j, :, :D] for j in range(S)], lse=lse_bank)
    want_o1, want_lse = plan.phase1(src, qs)
    np.testing.assert_array_equal(o1_bank[:, :, :D], want_o1)
    np.testing.assert_array_equal(lse_bank, want_lse)


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("fuse_add", [False, True])
@pytest.mark.parametrize("epilogue", [False, True])
def test_phase2_matches_reference(dev, rng, heads, fuse_add, epilogue):
    plan = attnres.Plan(dev, None, op="phase2", dtype="f32", d=D, heads=heads, fuse_add=fuse_add,
                        epilogue=epilogue)
    o1 = rng.standard_normal((T, D)).astype(np.float32)
    lse = rng.standard_normal((T, heads)).astype(np.float32)
    b = rng.standard_normal((T, D)).astype(np.float32)
    f = rng.standard_normal((T, D)).astype(np.float32) if fuse_add else None
    q = rng.standard_normal(D).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    og = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32) if epilogue else None
    b0 = b.copy()
    kw = dict(gain=g, eps=1e-5, scale=1.1, sublayer=f)
    if epilogue:
        kw["out_gain"] = og
    result = plan.phase2(o1, lse, b, q, **kw)
    out, normed = result if epilogue else (result, None)
    ref_out, ref_normed, ref_b = reference.phase2(tolist(o1), tolist(lse), tolist(b0), tolist(q), tolist(g), heads,
                                                  1e-5, 1.1, tolist(f), tolist(og), 1e-6)
    assert rel_err(out, ref_out) <= TOL["f32"]
    if epilogue:
        assert rel_err(normed, ref_normed) <= TOL["f32"]
    # With the fused add the partial sum is updated in place.
    assert rel_err(b, ref_b) <= TOL["f32"]
    if not fuse_add:
        np.testing.assert_array_equal(b, b0)


def test_phase1_then_phase2_equals_mix(dev, rng):
    heads = 2
    src = rng.standard_normal((NB, T, D)).astype(np.float32)
    b = rng.standard_normal((T, D)).astype(np.float32)
    qs = rng.standard_normal((S, D)).astype(np.float32)
    p1 = attnres.Plan(dev, None, op="phase1", dtype="f32", d=D, n=NB, heads=heads, sites=S)
    p2 = attnres.Plan(dev, None, op="phase2", dtype="f32", d=D, heads=heads)
    pm = attnres.Plan(dev, None, dtype="f32", d=D, n=NB + 1, heads=heads)
    o1, lse = p1.phase1(src, qs)
    for j in range(S):
        got = p2.phase2(o1[j], lse[j], b, qs[j])
        want = pm.mix(list(src) + [b], qs[j])
        assert rel_err(got, want) <= 1e-5


def test_phase2_f16_through_numpy(dev, rng):
    plan = attnres.Plan(dev, None, op="phase2", dtype="f16", d=D)
    o1 = rng.standard_normal((T, D)).astype(np.float16)
    lse = rng.standard_normal((T, 1)).astype(np.float32)
    b = rng.standard_normal((T, D)).astype(np.float16)
    q = rng.standard_normal(D).astype(np.float32)
    out = plan.phase2(o1, lse, b, q)
    ref_out, _, _ = reference.phase2(tolist(o1), tolist(lse), tolist(b), tolist(q))
    assert out.dtype == np.float16 and rel_err(out, ref_out) <= TOL["f16"]
