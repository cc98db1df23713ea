"""Bad input is refused with a ValueError (or attnres.Error) that names the
problem, and nothing is written to out."""

import os

import numpy as np
import pytest

import attnres

D, N, T = 16, 3, 4


@pytest.fixture
def plan(dev):
    return attnres.Plan(dev, None, dtype="f32", d=D, n=N)


@pytest.fixture
def args(rng):
    return (rng.standard_normal((N, T, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32))


def refused(plan, match, *args, **kw):
    out = np.full((T, D), 7.0, np.float32)
    with pytest.raises(ValueError, match=match):
        plan.mix(*args, out=out, **kw)
    assert (out == 7.0).all(), "a refused call wrote to out"


def test_wrong_number_of_sources(plan, args):
    refused(plan, r"sources must have shape \(3, T, 16\)", args[0][:2], args[1])
    refused(plan, r"sources has 2 entries; this plan needs 3", [args[0][0], args[0][1]], args[1])


def test_wrong_d(plan, args):
    refused(plan, r"query must have shape \(16,\)", args[0], args[1][:8])
    refused(plan, r"sources\[1\] must have shape", [args[0][0], args[0][1][:, :8], args[0][2]], args[1])


def test_mismatched_t_between_views(plan, args):
    refused(plan, r"sources\[2\] must have shape", [args[0][0], args[0][1], args[0][2][:2]], args[1])


def test_wrong_dtype(plan, args):
    refused(plan, r"sources has dtype float64; this plan needs float32", args[0].astype(np.float64), args[1])
    refused(plan, r"query has dtype float16", args[0], args[1].astype(np.float16))
    refused(plan, r"sources\[0\] has dtype int32", [a.astype(np.int32) for a in args[0]], args[1])


def test_non_contiguous_rows(plan, args):
    wide = np.repeat(args[0], 2, axis=2)[:, :, ::2]
    refused(plan, r"rows are not contiguous \(element stride 2\)", wide, args[1])
    refused(plan, r"query must be contiguous", args[0], np.repeat(args[1], 2)[::2])


def test_negative_or_overlapping_token_strides(plan, args):
    refused(plan, r"token stride -16 is less than the row width", args[0][:, ::-1, :], args[1])
    out = np.full((T, D), 7.0, np.float32)
    overlapping = np.lib.stride_tricks.as_strided(out, (T, D), (4 * 4, 4))
    with pytest.raises(ValueError, match="token stride 4 is less than the row width 16"):
        plan.mix(*args, out=overlapping)
    assert (out == 7.0).all()


def test_not_an_array(plan, args):
    refused(plan, r"sources must be one \(3, T, 16\) array or a sequence", 3.0, args[1])
    refused(plan, r"query must be an array with __dlpack__", args[0], [1.0] * D)


def test_bad_scalars(plan, args):
    refused(plan, r"eps must be a positive finite number", *args, eps=0.0)
    refused(plan, r"eps must be a positive finite number", *args, eps=float("nan"))
    refused(plan, r"scale must be a finite number", *args, scale=float("inf"))
    refused(plan, r"scale must be a finite number", *args, scale=1e300)


def test_arguments_of_another_form(dev, plan, args):
    refused(plan, r"partial= needs a plan made with form='additive'", *args, partial=args[0][0])
    refused(plan, r"out_gain= needs a plan made with epilogue=True", *args, out_gain=args[1])
    refused(plan, r"normed= needs a plan made with epilogue=True", *args, normed=np.zeros((T, D), np.float32))
    epilogue = attnres.Plan(dev, None, dtype="f32", d=D, n=N, epilogue=True)
    refused(epilogue, r"this plan has the output-norm epilogue: out_gain= is required", *args)
    additive = attnres.Plan(dev, None, dtype="f32", d=D, n=N, form="additive")
    refused(additive, r"this plan has the additive form: partial= is required", *args)
    with pytest.raises(ValueError, match="mix\\(\\) called on a plan for op phase2"):
        attnres.Plan(dev, None, op="phase2", d=D).mix(*args)


def test_wrong_output_dtype_or_shape(plan, args):
    with pytest.raises(ValueError, match=r"out has dtype float16"):
        plan.mix(*args, out=np.zeros((T, D), np.float16))
    with pytest.raises(ValueError, match=r"out must have shape \(4, 16\)"):
        plan.mix(*args, out=np.zeros((T + 1, D), np.float32))


def test_call_signature(plan, args):
    with pytest.raises(TypeError, match="unexpected keyword argument 'epsilon'"):
        plan.mix(*args, epsilon=1.0)
    with pytest.raises(TypeError, match="missing required argument 'query'"):
        plan.mix(args[0])
    with pytest.raises(TypeError, match="takes 2 positional arguments"):
        plan.mix(*args, None)
    with pytest.raises(TypeError, match="multiple values for argument 'query'"):
        plan.mix(*args, query=args[1])


def test_stream_on_the_cpu_is_refused(plan, args):
    refused(plan, r"stream= is only for CUDA plans", *args, stream=1)


def test_bf16_outputs_need_torch_or_out(dev, rng):
    plan = attnres.Plan(dev, None, dtype="bf16", d=D, n=N)
    with pytest.raises(ValueError, match=r"dtype float32; this plan needs bfloat16"):
        plan.mix(rng.standard_normal((N, T, D)).astype(np.float32), np.ones(D, np.float32))


@pytest.mark.parametrize("kw, match", [
    (dict(d=0, n=3), r"d must be given and be at least 1"),
    (dict(d=16), r"n \(the number of sources\) must be given"),
    (dict(d=16, n=3, heads=5), r"heads|divide"),
    (dict(d=16, n=3, heads=0), r"heads must be 1 to"),
    (dict(d=16, n=3, dtype="f64"), r"dtype must be one of f32, bf16, f16"),
    (dict(d=16, n=3, form="sideways"), r"form must be one of replace, additive"),
    (dict(d=16, n=3, op="phase3"), r"op must be one of mix, phase1, phase2"),
    (dict(d=16, n=3, op="phase1"), r"op='phase1' needs sites"),
    (dict(d=16, n=3, sites=2), r"sites is only for op='phase1'"),
    (dict(d=16, n=2**31), r"n \(the number of sources\) must be given and be 1 to"),
])
def test_bad_problems(dev, kw, match):
    with pytest.raises(ValueError, match=match):
        attnres.Plan(dev, None, **kw)


def test_bad_devices_and_databases(tmp_path):
    with pytest.raises(ValueError, match="not 'cuda:N'"):
        attnres.open_device("cuda:x")
    with pytest.raises(attnres.Error) as info:
        attnres.open_device("tpu")
    assert info.value.status_name in ("EINVAL", "ENODEV") and info.value.message
    with pytest.raises(attnres.Error, match="EDB") as info:
        attnres.open_db(os.fspath(tmp_path / "missing.db"))
    assert info.value.status == 4 and not isinstance(info.value, ValueError)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(attnres.Error, match="EDB"):
        attnres.open_db(junk)
    with pytest.raises(TypeError):
        attnres.Plan("cpu", None, d=16, n=1)


def test_require_exact_without_a_database(dev):
    with pytest.raises(attnres.Error) as info:
        attnres.Plan(dev, None, d=16, n=3, require_exact=True)
    assert info.value.status_name == "ENOTFOUND"


def test_phase_arguments(dev, rng):
    p1 = attnres.Plan(dev, None, op="phase1", d=D, n=N, sites=2)
    src = rng.standard_normal((N, T, D)).astype(np.float32)
    with pytest.raises(ValueError, match=r"queries must have shape \(2, 16\)"):
        p1.phase1(src, np.ones((3, D), np.float32))
    o1 = np.zeros((2, T, 2 * D), np.float32)
    with pytest.raises(ValueError, match="out views must share one token stride"):
        p1.phase1(src, np.ones((2, D), np.float32), out=[o1[0, :, :D], np.zeros((T, D), np.float32)])
    p2 = attnres.Plan(dev, None, op="phase2", d=D, heads=2)
    a = np.zeros((T, D), np.float32)
    with pytest.raises(ValueError, match=r"lse must have shape \(4, 2\)"):
        p2.phase2(a, np.zeros((T, 1), np.float32), a.copy(), np.ones(D, np.float32))
    with pytest.raises(ValueError, match="sublayer= needs a plan made with fuse_add=True"):
        p2.phase2(a, np.zeros((T, 2), np.float32), a.copy(), np.ones(D, np.float32), sublayer=a)
    fused = attnres.Plan(dev, None, op="phase2", d=D, heads=2, fuse_add=True)
    with pytest.raises(ValueError, match="this plan fuses the add: sublayer= is required"):
        fused.phase2(a, np.zeros((T, 2), np.float32), a.copy(), np.ones(D, np.float32))
    with pytest.raises(ValueError, match="phase1\\(\\) called on a plan for op phase2"):
        p2.phase1(src, np.ones((2, D), np.float32))


def test_time_c_runs_each_op(dev, rng):
    # The benchmark's C-side timer takes the arguments of the plan's own op.
    p2 = attnres.Plan(dev, None, op="phase2", d=D)
    a = rng.standard_normal((T, D)).astype(np.float32)
    wall, cpu = p2._time_c(3, a, np.zeros((T, 1), np.float32), a.copy(), np.ones(D, np.float32))
    assert wall > 0 and cpu > 0
    with pytest.raises(ValueError, match="repeat must be 1 to 1e8"):
        p2._time_c(0, a, np.zeros((T, 1), np.float32), a.copy(), np.ones(D, np.float32))
