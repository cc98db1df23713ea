"""plan.phase1_backward and plan.phase2_backward (plans made with
op='phase1_backward' and op='phase2_backward') against a NumPy float64
backward of Block AttnRes' two phases, which this file first checks against
central finite differences of a NumPy float64 forward of the phases: every
head count, N = 1, the gain folded or not, lse gradients given or not (None
is zero), sources and gradients as one array or as strided views, the fused
add and the output-norm epilogue, accumulation into given gradients,
float32 source gradients for f16 storage, phase 1 and phase 2's backwards
chained against the mix backward over the n block sources plus the partial
sum, bit-identical results across calls, T = 0, Plan.workspace_size and
workspace=, and refused bad input."""

import numpy as np
import pytest

import attnres
from conftest import TOL, rel_err

D, NB, S, T = 32, 3, 2, 6


# ---- the two phases and their backwards in NumPy, float64 -------------------------


def head_sum(x, heads):
    """(..., d) -> (..., H): the sum over each head's slice."""
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads).sum(-1)


def per_elem(x, d):
    """(..., H) -> (..., d): each head's value on its slice."""
    return np.repeat(x, d // x.shape[-1], axis=-1)


def inv_rms(x, eps):
    return 1.0 / np.sqrt((x * x).mean(-1) + eps)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def phase1_forward(v, us, heads, eps, scale):
    """o1 (S, T, d) and lse (S, T, H) of sources v (n, T, d) against the S folded queries us (S, d)."""
    d = v.shape[-1]
    r = inv_rms(v, eps)
    o1, lse = [], []
    for u in us:
        s = scale * r[..., None] * head_sum(v * u, heads)          # (n, T, H)
        m = s.max(0)
        e = np.exp(s - m)
        a = e / e.sum(0)
        o1.append((per_elem(a, d) * v).sum(0))
        lse.append(m + np.log(e.sum(0)))
    return np.stack(o1), np.stack(lse)


def phase2_forward(o1, lse, b, u, heads, eps, scale):
    """out of one site: b is the partial sum as the forward used it (after a fused add)."""
    s2 = scale * inv_rms(b, eps)[..., None] * head_sum(b * u, heads)
    p2 = per_elem(sigmoid(s2 - lse), b.shape[-1])
    return o1 + p2 * (b - o1)


def score_backward(v, u, r, dz, heads, scale):
    """The gradients that reach rows v (..., d) and the query u through the
    scores s_h = scale r <v, u>_h, given dz = dL/ds (..., H): dv, and du
    summed over every row. r = (mean(v^2) + eps)^-1/2 passes every head's
    score on to the whole row."""
    d = v.shape[-1]
    c = (dz * head_sum(v * u, heads)).sum(-1)
    dzk = per_elem(dz, d)
    dv = scale * r[..., None] * (dzk * u - v * (r * r * c)[..., None] / d)
    du = scale * (dzk * r[..., None] * v).reshape(-1, d).sum(0)
    return dv, du


def phase1_backward(v, us, do1, dlse, heads, eps, scale):
    """dv (n, T, d), summed over the sites, and dus (S, d) from do1 (S, T, d)
    and dlse (S, T, H) or None (zero)."""
    d = v.shape[-1]
    r = inv_rms(v, eps)
    dv, dus = np.zeros_like(v), np.zeros_like(us)
    for j, u in enumerate(us):
        s = scale * r[..., None] * head_sum(v * u, heads)
        a = np.exp(s - s.max(0))
        a /= a.sum(0)
        p = head_sum(do1[j] * v, heads)                            # (n, T, H)
        dz = a * ((0.0 if dlse is None else dlse[j]) + p - (a * p).sum(0))
        dscore, dus[j] = score_backward(v, u, r, dz, heads, scale)
        dv += per_elem(a, d) * do1[j] + dscore
    return dv, dus


def phase2_backward(o1, lse, b, u, g, heads, eps, scale):
    """do1, dlse, db and du from g, the gradient of out: out = o1 + p2 (b - o1)
    with p2 = sigmoid(s2 - lse), so o1 keeps 1 - p2 of g, b gets p2 of it, and
    <g, b - o1> reaches s2 and, negated, lse."""
    d = b.shape[-1]
    r = inv_rms(b, eps)
    p2 = sigmoid(scale * r[..., None] * head_sum(b * u, heads) - lse)
    pk = per_elem(p2, d)
    dx = p2 * (1 - p2) * head_sum(g * (b - o1), heads)
    db, du = score_backward(b, u, r, dx, heads, scale)
    return g * (1 - pk), -dx, db + g * pk, du


def norm_forward(out, out_gain, out_eps):
    return out * inv_rms(out, out_eps)[..., None] * out_gain


def norm_backward(out, out_gain, dnormed, out_eps):
    """The epilogue's backward: what it adds to out's gradient, and the gradient of out_gain."""
    d = out.shape[-1]
    rr = inv_rms(out, out_eps)[..., None]
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


def close(got, want):
    return np.allclose(got, want, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("heads,n,with_dlse", [(1, 3, True), (2, 3, True), (2, 3, False), (2, 1, True)])
def test_numpy_phase1_backward_matches_finite_differences(heads, n, with_dlse):
    rng = np.random.default_rng(5)
    t, d, sites = 3, 8, 2
    v = rng.standard_normal((n, t, d))
    us = rng.standard_normal((sites, d))
    do1 = rng.standard_normal((sites, t, d))
    dlse = rng.standard_normal((sites, t, heads)) if with_dlse else None
    eps, scale = 1e-3, 0.8

    def loss():
        o1, lse = phase1_forward(v, us, heads, eps, scale)
        return float((o1 * do1).sum() + ((lse * dlse).sum() if with_dlse else 0.0))

    dv, dus = phase1_backward(v, us, do1, dlse, heads, eps, scale)
    assert close(dv, numeric_grad(loss, v))
    assert close(dus, numeric_grad(loss, us))


@pytest.mark.parametrize("heads,epilogue", [(1, False), (2, False), (2, True)])
def test_numpy_phase2_backward_matches_finite_differences(heads, epilogue):
    rng = np.random.default_rng(9)
    t, d = 3, 8
    o1, b = rng.standard_normal((t, d)), rng.standard_normal((t, d))
    lse = rng.standard_normal((t, heads))
    u = rng.standard_normal(d)
    og = 1 + 0.2 * rng.standard_normal(d)
    dout, dn = rng.standard_normal((t, d)), rng.standard_normal((t, d))
    eps, scale, out_eps = 1e-3, 0.9, 1e-2

    def loss():
        out = phase2_forward(o1, lse, b, u, heads, eps, scale)
        return float((out * dout).sum() + ((norm_forward(out, og, out_eps) * dn).sum() if epilogue else 0.0))

    g = dout.copy()
    if epilogue:
        extra, dog = norm_backward(phase2_forward(o1, lse, b, u, heads, eps, scale), og, dn, out_eps)
        g += extra
        assert close(dog, numeric_grad(loss, og))
    do1, dlse, db, du = phase2_backward(o1, lse, b, u, g, heads, eps, scale)
    assert close(do1, numeric_grad(loss, o1))
    assert close(dlse, numeric_grad(loss, lse))
    assert close(db, numeric_grad(loss, b))
    assert close(du, numeric_grad(loss, u))


# ---- the plans against it ----------------------------------------------------------


def f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def strided_views(bank):
    """Each (T, D) entry of a bank as a view with its own token stride inside a wider buffer."""
    views = []
    for i in range(bank.shape[0]):
        wide = np.zeros((bank.shape[1], D + 8 * (i + 1)), dtype=bank.dtype)
        wide[:, 4:4 + D] = bank[i]
        views.append(wide[:, 4:4 + D])
    return views


def common_views(bank):
    """The entries of a bank as (T, D) views sharing one token stride (2 D)."""
    wide = np.zeros((bank.shape[0], bank.shape[1], 2 * D), dtype=bank.dtype)
    wide[:, :, :D] = bank
    return [wide[j, :, :D] for j in range(bank.shape[0])]


def phase1_inputs(rng, n=NB, heads=1, dtype=np.float32):
    src = rng.standard_normal((n, T, D)).astype(dtype)
    qs = rng.standard_normal((S, D)).astype(np.float32)
    gs = (1 + 0.1 * rng.standard_normal((S, D))).astype(np.float32)
    do1 = rng.standard_normal((S, T, D)).astype(dtype)
    dlse = rng.standard_normal((S, T, heads)).astype(np.float32)
    return src, qs, gs, do1, dlse


def phase2_inputs(rng, heads=1, dtype=np.float32):
    o1 = rng.standard_normal((T, D)).astype(dtype)
    lse = rng.standard_normal((T, heads)).astype(np.float32)
    b = rng.standard_normal((T, D)).astype(dtype)
    q = rng.standard_normal(D).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    dout = rng.standard_normal((T, D)).astype(dtype)
    return o1, lse, b, q, g, dout


def fold_backward(du, w, g):
    """The gradients of w and the gain from that of u = g * w (g None: ones)."""
    return (du, None) if g is None else (du * g, du * w)


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("n", [1, NB])
@pytest.mark.parametrize("gain", [True, False])
@pytest.mark.parametrize("with_dlse", [True, False])
def test_phase1_backward_matches_numpy(dev, rng, heads, n, gain, with_dlse):
    plan = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=n, heads=heads, sites=S)
    src, qs, gs, do1, dlse = phase1_inputs(rng, n, heads)
    gs = gs if gain else None
    dlse = dlse if with_dlse else None
    eps, scale = 1e-5, 0.7
    got = plan.phase1_backward(src, qs, do1, dlse, gains=gs, eps=eps, scale=scale)
    us = f64(qs) * (1.0 if gs is None else f64(gs))
    dv, dus = phase1_backward(f64(src), us, f64(do1), f64(dlse), heads, eps, scale)
    want_dw, want_dg = fold_backward(dus, f64(qs), f64(gs))
    assert len(got) == 3
    dsrc, dq, dg = got
    assert dsrc.shape == (n, T, D) and dsrc.dtype == np.float32
    assert dq.shape == (S, D) and dq.dtype == np.float32
    assert rel_err(dsrc, dv) <= TOL["f32"]
    if n == 1 and not with_dlse:
        # One source has weight exactly 1: no gradient reaches the queries.
        assert not dq.any()
    else:
        assert rel_err(dq, want_dw) <= TOL["f32"]
    if gain:
        assert dg.shape == (S, D) and dg.dtype == np.float32
        if n > 1 or with_dlse:
            assert rel_err(dg, want_dg) <= TOL["f32"]
    else:
        assert dg is None


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("fuse_add", [False, True])
@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("gain", [True, False])
def test_phase2_backward_matches_numpy(dev, rng, heads, fuse_add, epilogue, gain):
    plan = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=heads, fuse_add=fuse_add,
                        epilogue=epilogue)
    o1, lse, b, q, g, dout = phase2_inputs(rng, heads)
    g = g if gain else None
    og = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    dn = rng.standard_normal((T, D)).astype(np.float32)
    eps, scale, out_eps = 1e-5, 1.1, 1e-4
    kw = dict(gain=g, eps=eps, scale=scale)
    if epilogue:
        kw.update(out_gain=og, out_eps=out_eps, dnormed=dn)
    dsub = np.full((T, D), np.nan, np.float32) if fuse_add else None
    if fuse_add:
        kw["dsublayer"] = dsub
    got = plan.phase2_backward(o1, lse, b, q, dout, **kw)
    u = f64(q) * (1.0 if g is None else f64(g))
    grad = f64(dout)
    if epilogue:
        # The backward recomputes out from o1 and b; the epilogue's share is from it.
        extra, want_dog = norm_backward(phase2_forward(f64(o1), f64(lse), f64(b), u, heads, eps, scale), f64(og),
                                        f64(dn), out_eps)
        grad = grad + extra
    want = phase2_backward(f64(o1), f64(lse), f64(b), u, grad, heads, eps, scale)
    want_dw, want_dg = fold_backward(want[3], f64(q), f64(g))
    assert len(got) == (6 if epilogue else 5)
    do1, dlse, dpart, dq, dg = got[:5]
    assert do1.shape == (T, D) and do1.dtype == np.float32
    assert dlse.shape == (T, heads) and dlse.dtype == np.float32
    assert dq.shape == (D,) and dq.dtype == np.float32
    assert rel_err(do1, want[0]) <= TOL["f32"]
    assert rel_err(dlse, want[1]) <= TOL["f32"]
    assert rel_err(dpart, want[2]) <= TOL["f32"]
    assert rel_err(dq, want_dw) <= TOL["f32"]
    if gain:
        assert dg.shape == (D,) and rel_err(dg, want_dg) <= TOL["f32"]
    else:
        assert dg is None
    if epilogue:
        assert got[5].shape == (D,) and got[5].dtype == np.float32 and rel_err(got[5], want_dog) <= TOL["f32"]
    if fuse_add:
        # The sublayer output's gradient is the partial sum's.
        np.testing.assert_array_equal(dsub, dpart)


@pytest.mark.parametrize("epilogue", [False, True])
def test_phase2_backward_epilogue_without_dout(dev, rng, epilogue):
    """With the epilogue a loss may read normed alone: dout=None."""
    plan = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=2, epilogue=epilogue)
    o1, lse, b, q, g, dout = phase2_inputs(rng, 2)
    if not epilogue:
        with pytest.raises(ValueError, match="dout must not be None"):
            plan.phase2_backward(o1, lse, b, q, None)
        return
    og = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    dn = rng.standard_normal((T, D)).astype(np.float32)
    got = plan.phase2_backward(o1, lse, b, q, None, out_gain=og, dnormed=dn)
    out = phase2_forward(f64(o1), f64(lse), f64(b), f64(q), 2, 1e-6, 1.0)
    extra, want_dog = norm_backward(out, f64(og), f64(dn), 1e-6)
    want = phase2_backward(f64(o1), f64(lse), f64(b), f64(q), extra, 2, 1e-6, 1.0)
    for k in range(4):
        assert rel_err(got[k], want[k]) <= TOL["f32"]
    assert rel_err(got[5], want_dog) <= TOL["f32"]


def test_phase1_backward_views_and_given_outputs(dev, rng):
    """Strided sources and gradients, do1 and dlse as sequences of views sharing a stride."""
    plan = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, heads=2, sites=S)
    src, qs, gs, do1, dlse = phase1_inputs(rng, heads=2)
    lse_wide = np.zeros((S, T, 4), np.float32)
    lse_wide[:, :, :2] = dlse
    dsrc = strided_views(np.zeros_like(src))
    dq, dg = np.full((S, D), np.nan, np.float32), np.full((S, D), np.nan, np.float32)
    got = plan.phase1_backward(strided_views(src), qs, common_views(do1), [lse_wide[j, :, :2] for j in range(S)],
                               gains=gs, dsources=dsrc, dqueries=dq, dgains=dg)
    assert got[0] is dsrc and got[1] is dq and got[2] is dg
    dv, dus = phase1_backward(f64(src), f64(qs) * f64(gs), f64(do1), f64(dlse), 2, 1e-6, 1.0)
    assert rel_err(np.stack(dsrc), dv) <= TOL["f32"]
    assert rel_err(dq, dus * f64(gs)) <= TOL["f32"] and rel_err(dg, dus * f64(qs)) <= TOL["f32"]


def test_phase2_backward_views_and_given_outputs(dev, rng):
    plan = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=2)
    o1, lse, b, q, g, dout = phase2_inputs(rng, 2)
    bank = np.zeros((T, 3, D), np.float32)
    bank[:, 0], bank[:, 1] = o1, b
    grads = np.full((T, 2, D), np.nan, np.float32)
    dlse, dq, dg = np.full((T, 2), np.nan, np.float32), np.full(D, np.nan, np.float32), np.full(D, np.nan, np.float32)
    got = plan.phase2_backward(bank[:, 0], lse, bank[:, 1], q, dout, gain=g, do1=grads[:, 0], dlse=dlse,
                               dpartial=grads[:, 1], dquery=dq, dgain=dg)
    assert got[1] is dlse and got[3] is dq and got[4] is dg
    want = phase2_backward(f64(o1), f64(lse), f64(b), f64(q) * f64(g), f64(dout), 2, 1e-6, 1.0)
    assert rel_err(grads[:, 0], want[0]) <= TOL["f32"] and rel_err(grads[:, 1], want[2]) <= TOL["f32"]
    assert rel_err(dlse, want[1]) <= TOL["f32"]
    assert rel_err(dq, want[3] * f64(g)) <= TOL["f32"] and rel_err(dg, want[3] * f64(q)) <= TOL["f32"]


def test_phase1_backward_accumulates(dev, rng):
    plan = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, heads=2, sites=S)
    src, qs, _, do1, dlse = phase1_inputs(rng, heads=2)
    base = rng.standard_normal((NB, T, D)).astype(np.float32)
    dsrc = base.copy()
    got = plan.phase1_backward(src, qs, do1, dlse, dsources=dsrc, accumulate=True)
    assert got[0] is dsrc
    dv, dus = phase1_backward(f64(src), f64(qs), f64(do1), f64(dlse), 2, 1e-6, 1.0)
    assert rel_err(dsrc - base, dv) <= 1e-5
    # The query gradients are sums over tokens: always written, never accumulated.
    assert rel_err(got[1], dus) <= TOL["f32"]


def test_phase1_backward_accumulates_one_tensor_feeding_two_sources(dev, rng):
    plan = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=2, sites=S)
    x = rng.standard_normal((T, D)).astype(np.float32)
    _, qs, _, do1, _ = phase1_inputs(rng)
    dx = np.zeros((T, D), np.float32)
    plan.phase1_backward([x, x], qs, do1, dsources=[dx, dx], accumulate=True)
    dv, _ = phase1_backward(np.stack([f64(x), f64(x)]), f64(qs), f64(do1), None, 1, 1e-6, 1.0)
    assert rel_err(dx, dv[0] + dv[1]) <= TOL["f32"]


@pytest.mark.parametrize("fuse_add", [False, True])
def test_phase2_backward_accumulates(dev, rng, fuse_add):
    plan = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=2, fuse_add=fuse_add)
    o1, lse, b, q, _, dout = phase2_inputs(rng, 2)
    bases = [rng.standard_normal(shape).astype(np.float32) for shape in ((T, D), (T, 2), (T, D), (T, D))]
    do1, dlse, dpart, dsub = (x.copy() for x in bases)
    kw = dict(dsublayer=dsub) if fuse_add else {}
    got = plan.phase2_backward(o1, lse, b, q, dout, do1=do1, dlse=dlse, dpartial=dpart, accumulate=True, **kw)
    assert got[0] is do1 and got[1] is dlse and got[2] is dpart
    want = phase2_backward(f64(o1), f64(lse), f64(b), f64(q), f64(dout), 2, 1e-6, 1.0)
    for x, base, w in zip((do1, dlse, dpart), bases, want):
        assert rel_err(x - base, w) <= 1e-5
    if fuse_add:
        assert rel_err(dsub - bases[3], want[2]) <= 1e-5
    else:
        np.testing.assert_array_equal(dsub, bases[3])
    assert rel_err(got[3], want[3]) <= TOL["f32"]


@pytest.mark.parametrize("accumulate", [False, True])
def test_phase1_backward_dsources_f32(dev, rng, accumulate):
    """f16 storage with float32 source gradients: unrounded, so held to fp32's tolerance."""
    plan = attnres.Plan(dev, None, op="phase1_backward", dtype="f16", d=D, n=NB, heads=2, sites=S)
    src, qs, gs, do1, dlse = phase1_inputs(rng, heads=2, dtype=np.float16)
    base = rng.standard_normal((NB, T, D)).astype(np.float32) if accumulate else np.zeros((NB, T, D), np.float32)
    dsrc = base.copy()
    got = plan.phase1_backward(src, qs, do1, dlse, gains=gs, dsources=dsrc if accumulate else None,
                               accumulate=accumulate, dsources_f32=True)
    dv, dus = phase1_backward(f64(src), f64(qs) * f64(gs), f64(do1), f64(dlse), 2, 1e-6, 1.0)
    assert got[0].dtype == np.float32
    assert rel_err(got[0] - base, dv) <= TOL["f32"]
    assert rel_err(got[1], dus * f64(gs)) <= TOL["f16"]
    with pytest.raises(ValueError, match="dsources"):
        plan.phase1_backward(src, qs, do1, dlse, dsources=np.zeros((NB, T, D), np.float32))


def test_f16_backwards(dev, rng):
    p1 = attnres.Plan(dev, None, op="phase1_backward", dtype="f16", d=D, n=NB, heads=4, sites=S)
    src, qs, _, do1, dlse = phase1_inputs(rng, heads=4, dtype=np.float16)
    dsrc, dq, _ = p1.phase1_backward(src, qs, do1, dlse)
    dv, dus = phase1_backward(f64(src), f64(qs), f64(do1), f64(dlse), 4, 1e-6, 1.0)
    assert dsrc.dtype == np.float16 and rel_err(dsrc, dv) <= TOL["f16"] and rel_err(dq, dus) <= TOL["f16"]
    p2 = attnres.Plan(dev, None, op="phase2_backward", dtype="f16", d=D, heads=4)
    o1, lse, b, q, _, dout = phase2_inputs(rng, 4, dtype=np.float16)
    got = p2.phase2_backward(o1, lse, b, q, dout)
    want = phase2_backward(f64(o1), f64(lse), f64(b), f64(q), f64(dout), 4, 1e-6, 1.0)
    assert got[0].dtype == np.float16 and got[1].dtype == np.float32 and got[2].dtype == np.float16
    for x, w in zip(got[:4], want):
        assert rel_err(x, w) <= TOL["f16"]


@pytest.mark.parametrize("heads", [1, 2])
def test_chained_backwards_equal_the_mix_backward(dev, rng, heads):
    """Phase 1 then phase 2 is the mix over the n block sources plus the
    partial sum b (DESIGN §1), so phase 2's backward followed by phase 1's
    gives the mix backward's gradients: the sources', b's, and the query's
    as the sum of the two phases' shares."""
    src, qs, gs, _, _ = phase1_inputs(rng, heads=heads)
    b = rng.standard_normal((T, D)).astype(np.float32)
    dout = rng.standard_normal((S, T, D)).astype(np.float32)
    p1 = attnres.Plan(dev, None, op="phase1", dtype="f32", d=D, n=NB, heads=heads, sites=S)
    p1b = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, heads=heads, sites=S)
    p2b = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=heads)
    mixb = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=NB + 1, heads=heads)
    o1, lse = p1.phase1(src, qs, gains=gs)
    do1, dlse = np.zeros_like(o1), np.zeros_like(lse)
    db, dq2, dg2 = np.zeros((T, D)), np.zeros((S, D)), np.zeros((S, D))
    for j in range(S):
        got = p2b.phase2_backward(o1[j], lse[j], b, qs[j], dout[j], gain=gs[j], do1=do1[j], dlse=dlse[j])
        db += got[2]
        dq2[j], dg2[j] = got[3], got[4]
    dsrc, dq1, dg1 = p1b.phase1_backward(src, qs, do1, dlse, gains=gs)
    want_dsrc, want_db = np.zeros((NB, T, D)), np.zeros((T, D))
    for j in range(S):
        w_dsrc, w_dq, w_dg = mixb.mix_backward(np.concatenate([src, b[None]]), qs[j], dout[j], gain=gs[j])
        want_dsrc += w_dsrc[:NB]
        want_db += w_dsrc[NB]
        assert rel_err(dq1[j] + dq2[j], w_dq) <= TOL["f32"]
        assert rel_err(dg1[j] + dg2[j], w_dg) <= TOL["f32"]
    assert rel_err(dsrc, want_dsrc) <= TOL["f32"]
    assert rel_err(db, want_db) <= TOL["f32"]


def test_backwards_are_deterministic(dev, rng):
    big_t = 300  # several token groups, so the sums over tokens have partials to add
    p1 = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, heads=2, sites=S)
    src = rng.standard_normal((NB, big_t, D)).astype(np.float32)
    qs, gs = rng.standard_normal((S, D)).astype(np.float32), rng.standard_normal((S, D)).astype(np.float32)
    do1 = rng.standard_normal((S, big_t, D)).astype(np.float32)
    dlse = rng.standard_normal((S, big_t, 2)).astype(np.float32)
    first = p1.phase1_backward(src, qs, do1, dlse, gains=gs)
    p1.phase1_backward(src[:, :5], qs, do1[:, :5], dlse[:, :5], gains=gs)  # the scratch reused at another size
    second = p1.phase1_backward(src, qs, do1, dlse, gains=gs)
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes()
    p2 = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=2, epilogue=True)
    rows = [rng.standard_normal((big_t, w)).astype(np.float32) for w in (D, 2, D, D, D)]
    args = rows[:3] + [qs[0], rows[3]]
    kw = dict(gain=gs[0], out_gain=gs[1], dnormed=rows[4])
    first = p2.phase2_backward(*args, **kw)
    second = p2.phase2_backward(*args, **kw)
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes()


def test_zero_tokens(dev):
    p1 = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, sites=S)
    dsrc, dq, dg = p1.phase1_backward(np.zeros((NB, 0, D), np.float32), np.ones((S, D), np.float32),
                                      np.zeros((S, 0, D), np.float32))
    assert dsrc.shape == (NB, 0, D) and dq.shape == (S, D) and not dq.any() and dg is None
    p2 = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, epilogue=True)
    z = np.zeros((0, D), np.float32)
    do1, dlse, dpart, dq, dg, dog = p2.phase2_backward(z, np.zeros((0, 1), np.float32), z, np.ones(D, np.float32), z,
                                                       out_gain=np.ones(D, np.float32), dnormed=z)
    assert do1.shape == (0, D) and dlse.shape == (0, 1) and not dq.any() and not dog.any() and dg is None


def aligned_bytes(n):
    """A writable uint8 array of n bytes starting on a 64-byte boundary."""
    buf = np.zeros(n + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return buf[off:off + n]


def test_workspace_size_and_workspace(dev, rng):
    assert attnres.Plan(dev, None, op="mix", dtype="f32", d=D, n=NB).workspace_size(1000) == 0
    assert attnres.Plan(dev, None, op="phase1", dtype="f32", d=D, n=NB, sites=S).workspace_size(1000) == 0
    p1 = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, heads=2, sites=S)
    p2 = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=2)
    for plan in (p1, p2):
        assert plan.workspace_size(0) >= 0
        assert 0 < plan.workspace_size(T) <= plan.workspace_size(100000)
        with pytest.raises(ValueError, match="workspace_size"):
            plan.workspace_size(-1)
    mb = attnres.Plan(dev, None, op="mix_backward", dtype="f32", d=D, n=NB)
    assert mb.workspace_size(T) == mb.mix_backward_workspace_size(T)
    # A caller's workspace instead of the plan's scratch; one too small is refused.
    src, qs, gs, do1, dlse = phase1_inputs(rng, heads=2)
    want = p1.phase1_backward(src, qs, do1, dlse, gains=gs)
    got = p1.phase1_backward(src, qs, do1, dlse, gains=gs, workspace=aligned_bytes(p1.workspace_size(T)))
    for a, b in zip(want, got):
        assert a.tobytes() == b.tobytes()
    with pytest.raises(ValueError, match="workspace"):
        p1.phase1_backward(src, qs, do1, dlse, workspace=aligned_bytes(p1.workspace_size(T) - 64))
    o1, lse, b, q, g, dout = phase2_inputs(rng, 2)
    want = p2.phase2_backward(o1, lse, b, q, dout, gain=g)
    got = p2.phase2_backward(o1, lse, b, q, dout, gain=g, workspace=aligned_bytes(p2.workspace_size(T)))
    for a, b_ in zip(want, got):
        assert a.tobytes() == b_.tobytes()
    with pytest.raises(ValueError, match="workspace must be contiguous"):
        p2.phase2_backward(o1, lse, b, q, dout, workspace=aligned_bytes(4 * p2.workspace_size(T))[::2])


def test_time_c_runs_the_backwards(dev, rng):
    p1 = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, sites=S)
    src, qs, gs, do1, dlse = phase1_inputs(rng)
    wall, cpu = p1._time_c(3, src, qs, do1, dlse, gains=gs)
    assert wall > 0 and cpu > 0
    p2 = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D)
    o1, lse, b, q, g, dout = phase2_inputs(rng)
    wall, cpu = p2._time_c(3, o1, lse, b, q, dout, gain=g)
    assert wall > 0 and cpu > 0


def test_plan_properties(dev):
    p1 = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, heads=2, sites=S)
    assert p1.problem["op"] == "phase1_backward" and p1.problem["sites"] == S
    assert "op=phase1_backward" in repr(p1)
    p2 = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, fuse_add=True, epilogue=True)
    assert p2.problem["op"] == "phase2_backward" and p2.problem["n"] == 1 and p2.problem["fuse_add"]
    assert "op=phase2_backward" in repr(p2)


def test_bad_problems(dev):
    with pytest.raises(ValueError, match="op='phase1_backward' needs sites"):
        attnres.Plan(dev, None, op="phase1_backward", d=D, n=NB)
    with pytest.raises(ValueError, match="sites is only for op='phase1' and op='phase1_backward'"):
        attnres.Plan(dev, None, op="phase2_backward", d=D, sites=2)
    with pytest.raises(ValueError, match="no additive form"):
        attnres.Plan(dev, None, op="phase2_backward", d=D, form="additive")
    with pytest.raises(ValueError, match="epilogue"):
        attnres.Plan(dev, None, op="phase1_backward", d=D, n=NB, sites=S, epilogue=True)
    with pytest.raises(ValueError, match="64"):
        attnres.Plan(dev, None, op="phase1_backward", d=D, n=NB, sites=65)


def test_phase1_backward_bad_input(dev, rng):
    plan = attnres.Plan(dev, None, op="phase1_backward", dtype="f32", d=D, n=NB, heads=2, sites=S)
    src, qs, gs, do1, dlse = phase1_inputs(rng, heads=2)
    with pytest.raises(TypeError, match="missing required argument 'do1'"):
        plan.phase1_backward(src, qs)
    with pytest.raises(TypeError, match="takes 4 positional arguments but 5 were given"):
        plan.phase1_backward(src, qs, do1, dlse, gs)
    with pytest.raises(TypeError, match="multiple values for argument 'dlse'"):
        plan.phase1_backward(src, qs, do1, dlse, dlse=dlse)
    with pytest.raises(TypeError, match="unexpected keyword argument 'gain'"):
        plan.phase1_backward(src, qs, do1, gain=gs[0])
    with pytest.raises(ValueError, match="accumulate=True adds into the given gradients: pass dsources="):
        plan.phase1_backward(src, qs, do1, accumulate=True)
    with pytest.raises(ValueError, match="dgains= is the gradient of gains="):
        plan.phase1_backward(src, qs, do1, dgains=np.zeros((S, D), np.float32))
    with pytest.raises(ValueError, match="eps must be a positive finite number"):
        plan.phase1_backward(src, qs, do1, eps=-1.0)
    with pytest.raises(ValueError, match=r"queries must have shape \(2, 32\)"):
        plan.phase1_backward(src, qs[:1], do1)
    with pytest.raises(ValueError, match="do1"):
        plan.phase1_backward(src, qs, do1[:1])
    with pytest.raises(ValueError, match="do1"):
        plan.phase1_backward(src, qs, do1[:, :3])
    with pytest.raises(ValueError, match="do1 views must share one token stride"):
        plan.phase1_backward(src, qs, strided_views(do1))
    with pytest.raises(ValueError, match="dlse"):
        plan.phase1_backward(src, qs, do1, dlse.astype(np.float16))
    with pytest.raises(ValueError, match="dlse"):
        plan.phase1_backward(src, qs, do1, np.zeros((S, T, 1), np.float32))
    with pytest.raises(ValueError, match=r"dqueries must have shape \(2, 32\)"):
        plan.phase1_backward(src, qs, do1, dqueries=np.zeros((S, D + 1), np.float32))
    with pytest.raises(ValueError, match="dqueries must be contiguous"):
        plan.phase1_backward(src, qs, do1, dqueries=np.zeros((S, 2 * D), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="dsources"):
        plan.phase1_backward(src, qs, do1, dsources=np.zeros((NB, T + 1, D), np.float32))
    with pytest.raises(ValueError, match="stream= is only for CUDA plans"):
        plan.phase1_backward(src, qs, do1, stream=1)
    # An output that overlaps an input is refused by the runtime, with nothing written.
    with pytest.raises(attnres.ArgumentError, match="overlap"):
        plan.phase1_backward(src, qs, do1, dsources=src)
    with pytest.raises(ValueError, match=r"phase1_backward\(\) called on a plan for op phase1 "):
        attnres.Plan(dev, None, op="phase1", d=D, n=NB, sites=S).phase1_backward(src, qs, do1)
    with pytest.raises(ValueError, match=r"phase1\(\) called on a plan for op phase1_backward"):
        plan.phase1(src, qs)
    plan.close()
    with pytest.raises(ValueError, match="the plan is closed"):
        plan.phase1_backward(src, qs, do1)


def test_phase2_backward_bad_input(dev, rng):
    plan = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=2)
    o1, lse, b, q, g, dout = phase2_inputs(rng, 2)
    with pytest.raises(TypeError, match="missing required argument 'dout'"):
        plan.phase2_backward(o1, lse, b, q)
    with pytest.raises(ValueError, match="dsublayer= needs a plan made with fuse_add=True"):
        plan.phase2_backward(o1, lse, b, q, dout, dsublayer=np.zeros((T, D), np.float32))
    with pytest.raises(ValueError, match="out_gain= needs a plan made with epilogue=True"):
        plan.phase2_backward(o1, lse, b, q, dout, out_gain=g)
    with pytest.raises(ValueError, match="dnormed= needs a plan made with epilogue=True"):
        plan.phase2_backward(o1, lse, b, q, dout, dnormed=dout)
    with pytest.raises(ValueError, match="accumulate=True adds into the given gradients: pass do1=, dlse= and "):
        plan.phase2_backward(o1, lse, b, q, dout, do1=np.zeros_like(o1), dpartial=np.zeros_like(o1),
                             accumulate=True)
    with pytest.raises(ValueError, match="dgain= is the gradient of gain="):
        plan.phase2_backward(o1, lse, b, q, dout, dgain=np.zeros(D, np.float32))
    with pytest.raises(ValueError, match=r"lse must have shape \(6, 2\)"):
        plan.phase2_backward(o1, lse[:, :1], b, q, dout)
    with pytest.raises(ValueError, match=r"partial must have shape \(6, 32\)"):
        plan.phase2_backward(o1, lse, b[:3], q, dout)
    with pytest.raises(ValueError, match="dout"):
        plan.phase2_backward(o1, lse, b, q, dout.astype(np.float16))
    with pytest.raises(ValueError, match=r"query must have shape \(32,\)"):
        plan.phase2_backward(o1, lse, b, q[:5], dout)
    with pytest.raises(ValueError, match=r"dlse must have shape \(6, 2\)"):
        plan.phase2_backward(o1, lse, b, q, dout, dlse=np.zeros((T, 1), np.float32))
    with pytest.raises(ValueError, match="dquery must have shape"):
        plan.phase2_backward(o1, lse, b, q, dout, dquery=np.zeros(D + 1, np.float32))
    with pytest.raises(attnres.ArgumentError, match="overlap"):
        plan.phase2_backward(o1, lse, b, q, dout, do1=o1)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        plan.phase2_backward(o1, lse, b, q, dout, scale=float("inf"))
    epi = attnres.Plan(dev, None, op="phase2_backward", dtype="f32", d=D, heads=2, epilogue=True)
    with pytest.raises(ValueError, match="needs out_gain= and dnormed="):
        epi.phase2_backward(o1, lse, b, q, dout, out_gain=g)
    with pytest.raises(ValueError, match="out_eps must be a positive finite number"):
        epi.phase2_backward(o1, lse, b, q, dout, out_gain=g, dnormed=dout, out_eps=0.0)
    with pytest.raises(ValueError, match=r"phase2_backward\(\) called on a plan for op phase2 "):
        attnres.Plan(dev, None, op="phase2", d=D, heads=2).phase2_backward(o1, lse, b, q, dout)
    with pytest.raises(ValueError, match=r"mix_backward\(\) called on a plan for op phase2_backward"):
        plan.mix_backward([o1], q, dout)
