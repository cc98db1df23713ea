"""plan.mix_backward (a plan made with op='mix_backward') against a NumPy
float64 backward written from DESIGN §1b, which this file first checks
against central finite differences of a NumPy float64 forward of §1: every
head count, the replacement and additive forms, N = 1, with and without the
gain, sources as one array or as strided views, accumulation into given
gradients, bit-identical results across calls, and refused bad input."""

import numpy as np
import pytest

import attnres
from conftest import TOL, rel_err

D, N, T = 32, 4, 6


# ---- DESIGN §1 and §1b in NumPy, float64 -------------------------------------


def forward(v, w, g, heads, eps, scale, partial=None, alpha=1.0):
    """out for sources v (N, T, d), pseudo-query w and gain g (None: ones)."""
    n, t, d = v.shape
    u = w * (1.0 if g is None else g)
    r = 1.0 / np.sqrt((v * v).mean(-1) + eps)                      # (N, T)
    q = (v * u).reshape(n, t, heads, d // heads).sum(-1)           # (N, T, H)
    s = scale * r[..., None] * q
    a = np.exp(s - s.max(0, keepdims=True))
    a /= a.sum(0, keepdims=True)
    mix = (np.repeat(a, d // heads, axis=-1) * v).sum(0)           # (T, d)
    return mix if partial is None else partial + alpha * mix


def backward(v, w, g, dout, heads, eps, scale, additive=False, alpha=1.0):
    """The gradients of §1b: dv (N, T, d), dw, dg (None without g), and in
    the additive form d(partial) and d(alpha)."""
    n, t, d = v.shape
    dh = d // heads
    gain = np.ones(d) if g is None else g
    u = w * gain
    r = 1.0 / np.sqrt((v * v).mean(-1) + eps)
    q = (v * u).reshape(n, t, heads, dh).sum(-1)
    s = scale * r[..., None] * q
    a = np.exp(s - s.max(0, keepdims=True))
    a /= a.sum(0, keepdims=True)
    ak = np.repeat(a, dh, axis=-1)                                  # α per element
    mix = (ak * v).sum(0)
    gm = alpha * dout if additive else dout
    p = (gm * v).reshape(n, t, heads, dh).sum(-1)                   # (N, T, H)
    delta = (a * p).sum(0, keepdims=True)
    dz = a * (p - delta)
    c = (dz * q).sum(-1)                                            # (N, T)
    dzk = np.repeat(dz, dh, axis=-1)
    dv = ak * gm + scale * r[..., None] * (dzk * u - v * (r * r * c)[..., None] / d)
    du = scale * (dzk * r[..., None] * v).sum((0, 1))
    dw = du * gain
    dg = None if g is None else du * w
    if not additive:
        return dv, dw, dg
    return dv, dw, dg, dout.copy(), float((dout * mix).sum())


def norm_forward(out, out_gain, out_eps):
    """The output-norm epilogue: normed = out * rr * out_gain, rr = 1 / rms(out)."""
    rr = 1.0 / np.sqrt((out * out).mean(-1, keepdims=True) + out_eps)
    return out * rr * out_gain


def norm_backward(out, out_gain, dnormed, out_eps):
    """The epilogue's backward: the gradient it adds to out's, and that of out_gain."""
    d = out.shape[-1]
    rr = 1.0 / np.sqrt((out * out).mean(-1, keepdims=True) + out_eps)
    dot = (dnormed * out_gain * out).sum(-1, keepdims=True)
    return rr * dnormed * out_gain - out * rr ** 3 * dot / d, (rr * dnormed * out).sum(0)


def numeric_grad(f, x, h=1e-6):
    """Central finite differences of the scalar f() in every element of x (in place)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + h
        up = f()
        flat[i] = keep - h
        down = f()
        flat[i] = keep
        gflat[i] = (up - down) / (2 * h)
    return grad


@pytest.mark.parametrize("heads,n,additive", [(1, 3, False), (2, 3, False), (2, 3, True), (1, 1, False),
                                              (2, 1, True)])
def test_numpy_backward_matches_finite_differences(heads, n, additive):
    rng = np.random.default_rng(7)
    t, d = 3, 8
    v = rng.standard_normal((n, t, d))
    w = rng.standard_normal(d)
    g = 1 + 0.2 * rng.standard_normal(d)
    part = rng.standard_normal((t, d))
    dout = rng.standard_normal((t, d))
    eps, scale, alpha = 1e-3, 0.8, 0.6
    box = {"alpha": alpha}

    def loss():
        out = forward(v, w, g, heads, eps, scale, part if additive else None, box["alpha"])
        return float((out * dout).sum())

    got = backward(v, w, g, dout, heads, eps, scale, additive, alpha)
    assert np.allclose(got[0], numeric_grad(loss, v), atol=1e-7, rtol=1e-6)
    assert np.allclose(got[1], numeric_grad(loss, w), atol=1e-7, rtol=1e-6)
    assert np.allclose(got[2], numeric_grad(loss, g), atol=1e-7, rtol=1e-6)
    if additive:
        assert np.allclose(got[3], numeric_grad(loss, part), atol=1e-7, rtol=1e-6)
        a = np.array([alpha])

        def loss_alpha():
            box["alpha"] = a[0]
            return loss()

        assert np.allclose(got[4], numeric_grad(loss_alpha, a)[0], atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("additive", [False, True])
def test_numpy_epilogue_backward_matches_finite_differences(additive):
    """The epilogue's backward composed with the mix's: the loss reads out and normed."""
    rng = np.random.default_rng(11)
    t, d, heads = 3, 8, 2
    v = rng.standard_normal((3, t, d))
    w = rng.standard_normal(d)
    og = 1 + 0.2 * rng.standard_normal(d)
    part = rng.standard_normal((t, d))
    dout, dn = rng.standard_normal((t, d)), rng.standard_normal((t, d))
    eps, out_eps, alpha = 1e-3, 1e-2, 0.6

    def loss():
        out = forward(v, w, None, heads, eps, 1.0, part if additive else None, alpha)
        return float((out * dout).sum() + (norm_forward(out, og, out_eps) * dn).sum())

    out = forward(v, w, None, heads, eps, 1.0, part if additive else None, alpha)
    extra, dgain_out = norm_backward(out, og, dn, out_eps)
    got = backward(v, w, None, dout + extra, heads, eps, 1.0, additive, alpha)
    assert np.allclose(got[0], numeric_grad(loss, v), atol=1e-7, rtol=1e-6)
    assert np.allclose(got[1], numeric_grad(loss, w), atol=1e-7, rtol=1e-6)
    assert np.allclose(dgain_out, numeric_grad(loss, og), atol=1e-7, rtol=1e-6)


# ---- the plan against it -----------------------------------------------------


def inputs(rng, n=N, dtype=np.float32):
    src = rng.standard_normal((n, T, D)).astype(dtype)
    w = rng.standard_normal(D).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    dout = rng.standard_normal((T, D)).astype(dtype)
    return src, w, g, dout


def f64(x):
    return np.asarray(x, dtype=np.float64)


def strided_views(src):
    """Each source a (T, D) view with its own token stride inside a wider bank."""
    views = []
    for i in range(src.shape[0]):
        bank = np.zeros((src.shape[1], D + 8 * (i + 1)), dtype=src.dtype)
        bank[:, 4:4 + D] = src[i]
        views.append(bank[:, 4:4 + D])
    return views


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("form", ["replace", "additive"])
@pytest.mark.parametrize("n", [1, N])
@pytest.mark.parametrize("gain", [True, False])
def test_mix_backward_matches_numpy(dev, rng, heads, form, n, gain):
    additive = form == "additive"
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=n, heads=heads, form=form)
    src, w, g, dout = inputs(rng, n)
    g = g if gain else None
    eps, scale, alpha = 1e-5, 0.7, 0.5
    got = plan.mix_backward(src, w, dout, gain=g, eps=eps, scale=scale, **({"alpha": alpha} if additive else {}))
    want = backward(f64(src), f64(w), None if g is None else f64(g), f64(dout), heads, eps, scale, additive, alpha)
    assert len(got) == (5 if additive else 3)
    dsrc, dw, dg = got[:3]
    assert dsrc.shape == (n, T, D) and dsrc.dtype == np.float32
    assert dw.shape == (D,) and dw.dtype == np.float32
    assert rel_err(dsrc, want[0]) <= TOL["f32"]
    if n == 1:
        # §1b: with one source the weight is exactly 1, so no gradient reaches the query.
        assert not dw.any()
        assert dg is None or not dg.any()
    else:
        assert rel_err(dw, want[1]) <= TOL["f32"]
    if gain:
        assert dg.shape == (D,) and rel_err(dg, want[2]) <= TOL["f32"]
    else:
        assert dg is None
    if additive:
        dpart, dalpha = got[3], got[4]
        assert np.array_equal(dpart, dout)
        assert dalpha.shape == (1,) and abs(float(dalpha[0]) - want[4]) <= 1e-5 * max(1.0, abs(want[4]))


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("form", ["replace", "additive"])
@pytest.mark.parametrize("with_dout", [True, False])
def test_mix_backward_epilogue_matches_numpy(dev, rng, heads, form, with_dout):
    """The epilogue's backward from the forward's out; dout may be None."""
    additive = form == "additive"
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=N, heads=heads, form=form, epilogue=True)
    src, w, g, dout = inputs(rng)
    og = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    dn = rng.standard_normal((T, D)).astype(np.float32)
    part = rng.standard_normal((T, D)).astype(np.float32)
    alpha, out_eps = 0.5, 1e-4
    out = forward(f64(src), f64(w), f64(g), heads, 1e-6, 1.0, f64(part) if additive else None, alpha)
    out32 = out.astype(np.float32)
    extra, want_dog = norm_backward(f64(out32), f64(og), f64(dn), out_eps)
    total = extra + (f64(dout) if with_dout else 0.0)
    want = backward(f64(src), f64(w), f64(g), total, heads, 1e-6, 1.0, additive, alpha)
    got = plan.mix_backward(src, w, dout if with_dout else None, gain=g, out=out32, out_gain=og, out_eps=out_eps,
                            dnormed=dn, **({"alpha": alpha} if additive else {}))
    assert len(got) == (6 if additive else 4)
    assert rel_err(got[0], want[0]) <= TOL["f32"]
    assert rel_err(got[1], want[1]) <= TOL["f32"] and rel_err(got[2], want[2]) <= TOL["f32"]
    assert got[-1].shape == (D,) and got[-1].dtype == np.float32 and rel_err(got[-1], want_dog) <= TOL["f32"]
    if additive:
        assert rel_err(got[3], want[3]) <= TOL["f32"]
    with pytest.raises(ValueError, match="out_gain= and dnormed="):
        plan.mix_backward(src, w, dout, gain=g, out=out32, out_gain=og)
    plain = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=N, heads=heads, form=form)
    with pytest.raises(ValueError, match="epilogue=True"):
        plain.mix_backward(src, w, dout, out=out32)
    with pytest.raises(ValueError, match="dout must not be None"):
        plain.mix_backward(src, w, None)


def test_mix_backward_views_and_given_outputs(dev, rng):
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=N, heads=2, form="additive")
    src, w, g, dout = inputs(rng)
    want = backward(f64(src), f64(w), f64(g), f64(dout), 2, 1e-6, 1.0, True, 1.0)
    dsrc_views = strided_views(np.zeros_like(src))
    dq, dg, dp, da = (np.full(D, np.nan, np.float32), np.full(D, np.nan, np.float32),
                      np.full((T, D), np.nan, np.float32), np.full(1, np.nan, np.float32))
    got = plan.mix_backward(strided_views(src), w, dout, gain=g, dsources=dsrc_views, dquery=dq, dgain=dg,
                            dpartial=dp, dalpha=da)
    assert got[1] is dq and got[2] is dg and got[3] is dp and got[4] is da
    assert rel_err(np.stack(dsrc_views), want[0]) <= TOL["f32"]
    assert rel_err(dq, want[1]) <= TOL["f32"] and rel_err(dg, want[2]) <= TOL["f32"]


def test_mix_backward_accumulates(dev, rng):
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=N, form="additive")
    src, w, g, dout = inputs(rng)
    want = backward(f64(src), f64(w), f64(g), f64(dout), 1, 1e-6, 1.0, True, 1.0)
    base = rng.standard_normal((N, T, D)).astype(np.float32)
    pbase = rng.standard_normal((T, D)).astype(np.float32)
    dsrc, dpart = base.copy(), pbase.copy()
    got = plan.mix_backward(src, w, dout, gain=g, dsources=dsrc, dpartial=dpart, accumulate=True)
    assert got[0] is dsrc and got[3] is dpart
    assert rel_err(dsrc - base, want[0]) <= 1e-5
    assert np.allclose(dpart, pbase + dout, rtol=0, atol=1e-6)
    # dquery is a sum over tokens, and always written rather than accumulated.
    assert rel_err(got[1], want[1]) <= TOL["f32"]


def test_mix_backward_accumulates_one_tensor_feeding_two_sources(dev, rng):
    """A layer output that feeds two sources of one site gets both gradients added."""
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=2)
    x = rng.standard_normal((T, D)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    dout = rng.standard_normal((T, D)).astype(np.float32)
    want = backward(np.stack([f64(x), f64(x)]), f64(w), None, f64(dout), 1, 1e-6, 1.0)
    dx = np.zeros((T, D), np.float32)
    plan.mix_backward([x, x], w, dout, dsources=[dx, dx], accumulate=True)
    assert rel_err(dx, want[0][0] + want[0][1]) <= TOL["f32"]


def test_mix_backward_f16(dev, rng):
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f16", d=D, n=N, heads=4)
    src, w, g, dout = inputs(rng, dtype=np.float16)
    dsrc, dw, dg = plan.mix_backward(src, w, dout, gain=g)
    want = backward(f64(src), f64(w), f64(g), f64(dout), 4, 1e-6, 1.0)
    assert dsrc.dtype == np.float16
    assert rel_err(dsrc, want[0]) <= TOL["f16"]
    assert rel_err(dw, want[1]) <= TOL["f16"] and rel_err(dg, want[2]) <= TOL["f16"]


@pytest.mark.parametrize("form", ["replace", "additive"])
def test_mix_backward_is_deterministic(dev, rng, form):
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=N, heads=2, form=form)
    big_t = 300  # several token groups, so the sums over tokens have partials to add
    src = rng.standard_normal((N, big_t, D)).astype(np.float32)
    w, g = rng.standard_normal(D).astype(np.float32), rng.standard_normal(D).astype(np.float32)
    dout = rng.standard_normal((big_t, D)).astype(np.float32)
    first = plan.mix_backward(src, w, dout, gain=g)
    # A call at a smaller T in between, so the plan's scratch is reused at another size.
    plan.mix_backward(src[:, :5], w, dout[:5], gain=g)
    second = plan.mix_backward(src, w, dout, gain=g)
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes()


def test_mix_backward_zero_tokens(dev):
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=N, form="additive")
    src = np.zeros((N, 0, D), np.float32)
    dsrc, dw, dg, dpart, dalpha = plan.mix_backward(src, np.ones(D, np.float32), np.zeros((0, D), np.float32))
    assert dsrc.shape == (N, 0, D) and not dw.any() and dg is None and dpart.shape == (0, D) and dalpha[0] == 0


def test_mix_backward_plan_properties(dev):
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=N, heads=2)
    assert plan.problem["op"] == "mix_backward"
    assert "op=mix_backward" in repr(plan)


def test_mix_backward_bad_input(dev, rng):
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=N)
    src, w, g, dout = inputs(rng)
    with pytest.raises(TypeError, match="missing required argument 'dout'"):
        plan.mix_backward(src, w)
    with pytest.raises(TypeError, match="unexpected keyword argument 'partial'"):
        plan.mix_backward(src, w, dout, partial=dout)
    with pytest.raises(ValueError, match="dpartial= needs a plan made with form='additive'"):
        plan.mix_backward(src, w, dout, dpartial=dout)
    with pytest.raises(ValueError, match="dalpha= needs a plan made with form='additive'"):
        plan.mix_backward(src, w, dout, dalpha=np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="accumulate=True adds into the given gradients"):
        plan.mix_backward(src, w, dout, accumulate=True)
    with pytest.raises(ValueError, match="dgain= is the gradient of gain="):
        plan.mix_backward(src, w, dout, dgain=np.zeros(D, np.float32))
    with pytest.raises(ValueError, match="eps must be a positive finite number"):
        plan.mix_backward(src, w, dout, eps=0.0)
    with pytest.raises(ValueError, match=r"dout must have shape"):
        plan.mix_backward(src, w, dout[:3])
    with pytest.raises(ValueError, match="dout"):
        plan.mix_backward(src, w, dout.astype(np.float16))
    with pytest.raises(ValueError, match=r"query must have shape"):
        plan.mix_backward(src, w[:5], dout)
    with pytest.raises(ValueError, match="sources"):
        plan.mix_backward(src[:2], w, dout)
    with pytest.raises(ValueError, match="dquery must have shape"):
        plan.mix_backward(src, w, dout, dquery=np.zeros(D + 1, np.float32))
    with pytest.raises(ValueError, match="dsources"):
        plan.mix_backward(src, w, dout, dsources=np.zeros((N, T + 1, D), np.float32))
    with pytest.raises(ValueError, match="stream= is only for CUDA plans"):
        plan.mix_backward(src, w, dout, stream=1)
    ro = np.zeros((N, T, D), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dsources"):
        plan.mix_backward(src, w, dout, dsources=ro)
    # The forward's methods and the backward refuse each other's plans.
    with pytest.raises(ValueError, match="mix\\(\\) called on a plan for op mix_backward"):
        plan.mix(src, w)
    fwd = attnres.Plan(dev, None, op="mix", dtype="f32", d=D, n=N)
    with pytest.raises(ValueError, match="called on a plan for op mix"):
        fwd.mix_backward(src, w, dout)
    with pytest.raises(ValueError, match="op must be one of mix, phase1, phase2, mix_backward"):
        attnres.Plan(dev, None, op="backward", dtype="f32", d=D, n=N)
    plan.close()
    with pytest.raises(ValueError, match="the plan is closed"):
        plan.mix_backward(src, w, dout)


@pytest.mark.parametrize("accumulate", [False, True])
def test_mix_backward_dsources_f32(dev, rng, accumulate):
    """f16 storage with float32 source gradients: unrounded, so held to fp32's tolerance."""
    plan = attnres.Plan(dev, None, op="mix_backward", dtype="f16", d=D, n=N, heads=2)
    src, w, g, dout = inputs(rng, dtype=np.float16)
    want = backward(f64(src), f64(w), f64(g), f64(dout), 2, 1e-6, 1.0)
    base = rng.standard_normal((N, T, D)).astype(np.float32) if accumulate else np.zeros((N, T, D), np.float32)
    dsrc = base.copy()
    got = plan.mix_backward(src, w, dout, gain=g, dsources=dsrc if accumulate else None, accumulate=accumulate,
                            dsources_f32=True)
    assert got[0].dtype == np.float32
    assert rel_err(got[0] - base, want[0]) <= TOL["f32"]
    assert rel_err(got[1], want[1]) <= TOL["f16"]
    # Without the keyword the source gradients are the storage dtype's.
    with pytest.raises(ValueError, match="dsources"):
        plan.mix_backward(src, w, dout, dsources=np.zeros((N, T, D), np.float32))
