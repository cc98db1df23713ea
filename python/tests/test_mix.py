"""plan.mix against the fp64 reference through NumPy arrays: every form,
heads, the epilogue, and sources as one array or as strided views."""

import numpy as np
import pytest

import attnres
from conftest import TOL, reference, rel_err, tolist

D, N, T = 32, 4, 5


def check_mix(plan, rng, heads=1, additive=False, epilogue=False, gain=True, as_views=False, dtype="f32",
              eps=1e-6, scale=1.0, alpha=1.0, given_out=False):
    np_dtype = np.float16 if dtype == "f16" else np.float32
    src = rng.standard_normal((N, T, D)).astype(np_dtype)
    q = rng.standard_normal(D).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32) if gain else None
    part = rng.standard_normal((T, D)).astype(np_dtype) if additive else None
    og = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32) if epilogue else None
    if as_views:
        # Each source a (T, D) view with its own token stride, inside a wider bank.
        banks = [np.zeros((T, D + 8 * (i + 1)), dtype=np_dtype) for i in range(N)]
        sources = []
        for i in range(N):
            banks[i][:, 4:4 + D] = src[i]
            sources.append(banks[i][:, 4:4 + D])
        assert not sources[0].flags.c_contiguous
    else:
        sources = src
    kw = dict(gain=g, eps=eps, scale=scale)
    if additive:
        kw.update(partial=part, alpha=alpha)
    if epilogue:
        kw.update(out_gain=og)
    if given_out:
        kw["out"] = np.full((T, D), np.nan, dtype=np_dtype)
    result = plan.mix(sources, q, **kw)
    out, normed = result if epilogue else (result, None)
    if given_out:
        assert out is kw["out"]
    assert out.shape == (T, D) and out.dtype == np_dtype
    ref_out, ref_normed = reference.mix(tolist(src), tolist(q), tolist(g), heads, eps, scale, tolist(part), alpha,
                                        tolist(og), 1e-6)
    assert rel_err(out, ref_out) <= TOL[dtype]
    if epilogue:
        assert rel_err(normed, ref_normed) <= TOL[dtype]


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("form", ["replace", "additive"])
@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("as_views", [False, True])
def test_mix_matches_reference(dev, rng, heads, form, epilogue, as_views):
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N, heads=heads, form=form, epilogue=epilogue)
    check_mix(plan, rng, heads=heads, additive=form == "additive", epilogue=epilogue, as_views=as_views,
              eps=1e-5, scale=0.7, alpha=0.5)


def test_mix_f16_through_numpy(dev, rng):
    plan = attnres.Plan(dev, None, dtype="f16", d=D, n=N, heads=2, epilogue=True)
    check_mix(plan, rng, heads=2, epilogue=True, dtype="f16")


def test_mix_into_given_out_and_without_gain(dev, rng):
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N)
    check_mix(plan, rng, gain=False, given_out=True)


def test_mix_writes_into_a_strided_out_view(dev, rng):
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N)
    src = rng.standard_normal((N, T, D)).astype(np.float32)
    q = rng.standard_normal(D).astype(np.float32)
    wide = np.zeros((T, 2 * D), dtype=np.float32)
    plan.mix(src, q, out=wide[:, D:])
    want = plan.mix(src, q)
    np.testing.assert_array_equal(wide[:, D:], want)
    assert not wide[:, :D].any()


def test_mix_sources_as_a_tuple_of_rows_from_one_bank(dev, rng):
    # The engine's bank: source i is every N-th row block of one buffer.
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N)
    bank = rng.standard_normal((T, N, D)).astype(np.float32)
    q = rng.standard_normal(D).astype(np.float32)
    got = plan.mix(tuple(bank[:, i, :] for i in range(N)), q)
    want = plan.mix(np.ascontiguousarray(bank.transpose(1, 0, 2)), q)
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


def test_mix_with_t_zero_is_a_no_op(dev):
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=N)
    out = plan.mix(np.zeros((N, 0, D), np.float32), np.ones(D, np.float32))
    assert out.shape == (0, D)


def test_mix_with_one_source_returns_it(dev, rng):
    plan = attnres.Plan(dev, None, dtype="f32", d=D, n=1)
    src = rng.standard_normal((1, T, D)).astype(np.float32)
    np.testing.assert_allclose(plan.mix(src, np.ones(D, np.float32)), src[0], rtol=1e-6)


def test_version_matches_the_library():
    assert attnres.__version__ == attnres._core.version() == "0.2.0"
