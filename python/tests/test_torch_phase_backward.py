"""Training Block AttnRes through attnres.torch: the gradients of
torch.ops.attnres.phase1 followed by torch.ops.attnres.phase2 (sources, the
pseudo-queries w and their gains, the partial sum, the sublayer output of
the fused add, the output-norm gain) through autograd against plain float64
PyTorch autograd of the two phases (heads, the fused add, the epilogue, f32
and bf16, a loss that reads o1 but not lse); the two phases chained against
the mix's gradient over the n block sources plus the partial sum; the
backward ops' fake kernels through torch.library.opcheck; the fused add's
in-place write under autograd (a partial that is a view, and the version
check when a saved partial is changed again); and a
torch.compile(fullgraph=True) training step of a small Block AttnRes model
against the same model in plain PyTorch. Skipped, saying so, when torch is
not installed."""

import pytest

torch = pytest.importorskip("torch",
                            reason="torch is not installed: the attnres.torch phase backwards are not tested here")

import attnres.torch as art  # noqa: E402
from torch_training import check_compiled_step, check_sgd_steps  # noqa: E402

D, NB, S, T = 64, 3, 2, 7
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# DESIGN §1b: per gradient, fp32 to 1e-5, 16-bit storage to 1e-2, against
# the reference of the rounded inputs.
TOL = {"f32": 1e-5, "bf16": 1e-2}


def by_head(x, heads):
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads)


def plain_phase1(sources, queries, heads=1, eps=1e-6, scale=1.0):
    """DESIGN §1's phase 1 in plain PyTorch, differentiable: o1 (S, T, d) and lse (S, T, H)."""
    v = torch.stack(list(sources))
    r = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    o1, lse = [], []
    for u in queries.unbind(0):
        s = scale * by_head(r * v * u, heads).sum(-1)               # (n, T, H)
        a = torch.softmax(s, dim=0)
        o1.append((a.unsqueeze(-1) * by_head(v, heads)).sum(0).reshape(v.shape[1:]))
        lse.append(torch.logsumexp(s, dim=0))
    return torch.stack(o1), torch.stack(lse)


def plain_phase2(o1, lse, b, u, heads=1, eps=1e-6, scale=1.0, out_gain=None, out_eps=1e-6):
    """Phase 2 of one site on the partial sum b as it uses it (after a fused add): (out, normed or None)."""
    r = torch.rsqrt(b.pow(2).mean(-1, keepdim=True) + eps)
    p2 = torch.sigmoid(scale * by_head(r * b * u, heads).sum(-1) - lse).unsqueeze(-1)
    out = (by_head(o1, heads) + p2 * by_head(b - o1, heads)).reshape(b.shape)
    if out_gain is None:
        return out, None
    return out, out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + out_eps) * out_gain


def rel_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / (want.norm() or 1.0))


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def leaf(x):
    return x.detach().double().requires_grad_()


def kept(ref, got):
    """ref with the values of got (a kernel's output rounded to its storage
    type) and ref's gradient: the reference then reads what the kernel
    stored, as the next phase does."""
    return ref + (got.detach().double() - ref.detach())


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(41)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("fuse_add", [False, True])
@pytest.mark.parametrize("epilogue", [False, True])
def test_phase_gradients_match_plain_autograd(gen, dtype, heads, fuse_add, epilogue):
    """Site 0 reads o1 alone (a block's first site); site 1 goes through phase 2."""
    tdt = DTYPES[dtype]
    eps, scale, out_eps = 1e-5, 0.8, 1e-5
    w = randn(gen, S, D).requires_grad_()
    g = (1 + 0.1 * randn(gen, S, D)).requires_grad_()
    sources = [randn(gen, T, D, dtype=tdt).requires_grad_() for _ in range(NB)]
    b0 = randn(gen, T, D, dtype=tdt).requires_grad_()
    f = randn(gen, T, D, dtype=tdt).requires_grad_() if fuse_add else None
    og = (1 + 0.2 * randn(gen, D)).requires_grad_() if epilogue else None
    weights = [randn(gen, T, D) for _ in range(4)]

    def loss_of(o1, out, normed, b):
        loss = (o1[0].double() * weights[0].double()).sum() + (out.double() * weights[1].double()).sum()
        if normed is not None:
            loss = loss + (normed.double() * weights[2].double()).sum()
        if fuse_add:  # the partial sum after the add is read on, as the next sites do
            loss = loss + (b.double() * weights[3].double()).sum()
        return loss

    u = w * g
    o1, lse = torch.ops.attnres.phase1(sources, u, heads, eps, scale)
    b = b0 * 1.0  # a partial sum that the fused add may write
    out, normed = torch.ops.attnres.phase2(o1[1], lse[1], b, u[1], f, og, eps, scale, out_eps)
    if fuse_add:
        assert torch.equal(b, (b0 + f).to(tdt)) or rel_err(b, b0.double() + f.double()) <= TOL[dtype]
    loss_of(o1, out, normed if epilogue else None, b).backward()

    rs, rw, rg, rb0 = [leaf(s) for s in sources], leaf(w), leaf(g), leaf(b0)
    rf, rog = (leaf(f) if fuse_add else None), (leaf(og) if epilogue else None)
    ro1, rlse = plain_phase1(rs, rw * rg, heads, eps, scale)
    ro1 = kept(ro1, o1)
    rb = kept(rb0 + rf, b) if fuse_add else rb0
    rout, rnormed = plain_phase2(ro1[1], rlse[1], rb, (rw * rg)[1], heads, eps, scale, rog, out_eps)
    loss_of(ro1, rout, rnormed, rb).backward()

    tol = TOL[dtype]
    for got, want in zip(sources, rs):
        assert got.grad.dtype == tdt and rel_err(got.grad, want.grad) <= tol
    assert rel_err(w.grad, rw.grad) <= tol and rel_err(g.grad, rg.grad) <= tol
    assert b0.grad.dtype == tdt and rel_err(b0.grad, rb0.grad) <= tol
    if fuse_add:
        assert rel_err(f.grad, rf.grad) <= tol
    if epilogue:
        assert rel_err(og.grad, rog.grad) <= tol


@pytest.mark.parametrize("reads", ["o1", "lse", "out"])
def test_losses_that_read_part_of_the_outputs(gen, reads):
    """A loss that reads o1 alone gives phase 1's backward no lse gradient
    (None); one that reads lse alone, no o1 gradient (zeros)."""
    sources = [randn(gen, T, D).requires_grad_() for _ in range(NB)]
    w = randn(gen, S, D).requires_grad_()
    b = randn(gen, T, D).requires_grad_()
    o1, lse = torch.ops.attnres.phase1(sources, w, 2, 1e-6, 1.0)
    rs, rw, rb = [leaf(s) for s in sources], leaf(w), leaf(b)
    ro1, rlse = plain_phase1(rs, rw, 2)
    if reads == "o1":
        o1.pow(2).sum().backward()
        ro1.pow(2).sum().backward()
    elif reads == "lse":
        lse.pow(2).sum().backward()
        rlse.pow(2).sum().backward()
    else:
        out, _ = torch.ops.attnres.phase2(o1[0], lse[0], b, w[0], None, None, 1e-6, 1.0, 1e-6)
        out.pow(2).sum().backward()
        plain_phase2(ro1[0], rlse[0], rb, rw[0], 2)[0].pow(2).sum().backward()
        assert rel_err(b.grad, rb.grad) <= 1e-5
    for got, want in zip(sources, rs):
        assert rel_err(got.grad, want.grad) <= 1e-5
    assert rel_err(w.grad, rw.grad) <= 1e-5


@pytest.mark.parametrize("heads", [1, 2])
def test_phases_chained_equal_the_mix_gradient(gen, heads):
    """phase1 then phase2 is the mix over the n block sources plus the
    partial sum b (softmax over n + 1): so are their gradients."""
    sources = [randn(gen, T, D).requires_grad_() for _ in range(NB)]
    b = randn(gen, T, D).requires_grad_()
    u = randn(gen, S, D).requires_grad_()
    dout = randn(gen, S, T, D)
    o1, lse = torch.ops.attnres.phase1(sources, u, heads, 1e-5, 0.9)
    outs = [torch.ops.attnres.phase2(o1[j], lse[j], b, u[j], None, None, 1e-5, 0.9, 1e-6)[0] for j in range(S)]
    (torch.stack(outs) * dout).sum().backward()
    ms = [s.detach().clone().requires_grad_() for s in sources]
    mb, mu = b.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    mix = [torch.ops.attnres.mix(ms + [mb], mu[j], None, None, heads, 1e-5, 0.9, 1.0, 1e-6)[0] for j in range(S)]
    (torch.stack(mix) * dout).sum().backward()
    for got, want in zip(sources, ms):
        assert rel_err(got.grad, want.grad) <= 1e-5
    assert rel_err(b.grad, mb.grad) <= 1e-5
    assert rel_err(u.grad, mu.grad) <= 1e-5


def test_backward_ops_fake_kernels_agree_with_the_real_ones(gen):
    bf = torch.bfloat16
    sources = [randn(gen, T, D, dtype=bf) for _ in range(NB)]
    queries = randn(gen, S, D)
    do1, dlse = randn(gen, S, T, D, dtype=bf), randn(gen, S, T, 2)
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.attnres.phase1_backward.default, (sources, queries, do1, dlse, 2, 1e-6, 1.0),
                          test_utils=checks)
    torch.library.opcheck(torch.ops.attnres.phase1_backward.default, (sources, queries, do1, None, 2, 1e-6, 1.0),
                          test_utils=checks)
    o1, lse, b, dout = randn(gen, T, D, dtype=bf), randn(gen, T, 2), randn(gen, T, D, dtype=bf), randn(gen, T, D,
                                                                                                     dtype=bf)
    og, dn = 1 + 0.1 * randn(gen, D), randn(gen, T, D, dtype=bf)
    for args in ((o1, lse, b, queries[0], dout, False, 1e-6, 1.0),
                 (o1, lse, b, queries[0], dout, True, 1e-6, 1.0),
                 (o1, lse, b, queries[0], None, True, 1e-6, 1.0, og, dn, 1e-5)):
        torch.library.opcheck(torch.ops.attnres.phase2_backward.default, args, test_utils=checks)


def test_inference_is_unchanged(gen):
    """Without gradients the ops run as before: no graph, the fused add in place."""
    sources = [randn(gen, T, D).requires_grad_() for _ in range(NB)]
    u = randn(gen, S, D).requires_grad_()
    b, f = randn(gen, T, D), randn(gen, T, D)
    with torch.no_grad():
        o1, lse = torch.ops.attnres.phase1(sources, u, 1, 1e-6, 1.0)
        want_b = b + f
        out, _ = torch.ops.attnres.phase2(o1[0], lse[0], b, u[0], f, None, 1e-6, 1.0, 1e-6)
    assert o1.grad_fn is None and out.grad_fn is None and not out.requires_grad
    assert rel_err(b, want_b) <= 1e-7


def test_fused_add_into_a_view_and_the_version_check(gen):
    """A partial that is a view takes the add through torch (the gradients
    are the same); a saved partial changed in place again before the
    backward makes the backward fail, as autograd does for every saved
    tensor."""
    o1, lse = randn(gen, T, D).requires_grad_(), randn(gen, T, 1)
    u = randn(gen, D).requires_grad_()
    f = randn(gen, T, D).requires_grad_()
    bank = randn(gen, T, 2, D).requires_grad_()
    base = bank * 1.0
    partial = base[:, 0]
    out, _ = torch.ops.attnres.phase2(o1, lse, partial, u, f, None, 1e-6, 1.0, 1e-6)
    (out.pow(2).sum() + partial.sum()).backward()
    rbank, rf, ro1, ru = leaf(bank), leaf(f), leaf(o1), leaf(u)
    rb = rbank[:, 0] + rf
    (plain_phase2(ro1, lse.double(), rb, ru)[0].pow(2).sum() + rb.sum()).backward()
    assert rel_err(bank.grad, rbank.grad) <= 1e-5 and rel_err(f.grad, rf.grad) <= 1e-5
    assert rel_err(o1.grad, ro1.grad) <= 1e-5 and rel_err(u.grad, ru.grad) <= 1e-5

    b = randn(gen, T, D).requires_grad_() * 1.0
    out, _ = torch.ops.attnres.phase2(o1, lse, b, u, f, None, 1e-6, 1.0, 1e-6)
    b.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


# ---- a compiled training step -------------------------------------------------------


class TinyBlock(torch.nn.Module):
    """One block of Block AttnRes: three sites over two completed block
    representations (phase 1 once for all three), the first site reading
    its phase-1 output alone, the others phase 2 over the block's partial
    sum of sublayer outputs, the last with the fused add and the epilogue."""

    def __init__(self, d, plain, heads=2):
        super().__init__()
        self.plain, self.heads = plain, heads
        self.sub = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(3))
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 3 * d).reshape(3, d) * 0.5)
        self.g = torch.nn.Parameter(torch.ones(3, d))
        self.og = torch.nn.Parameter(torch.ones(d))

    def phase1(self, reps, u):
        if self.plain:
            return plain_phase1(reps, u, self.heads)
        return torch.ops.attnres.phase1(reps, u, self.heads, 1e-6, 1.0)

    def phase2(self, o1, lse, b, u, f=None, og=None):
        if self.plain:
            b = b if f is None else b + f
            return plain_phase2(o1, lse, b, u, self.heads, out_gain=og), b
        out = torch.ops.attnres.phase2(o1, lse, b, u, f, og, 1e-6, 1.0, 1e-6)
        return out, b

    def forward(self, x):
        reps = [x, torch.tanh(x)]
        u = self.w * self.g
        o1, lse = self.phase1(reps, u)
        f0 = torch.tanh(self.sub[0](o1[0]))
        (h1, _), _ = self.phase2(o1[1], lse[1], f0, u[1])
        f1 = torch.tanh(self.sub[1](h1))
        (h2, n2), b = self.phase2(o1[2], lse[2], f0 * 1.0, u[2], f1, self.og)
        return b + torch.tanh(self.sub[2](n2)) + h2


def make_pair():
    torch.manual_seed(0)
    fast = TinyBlock(32, plain=False)
    slow = TinyBlock(32, plain=True)
    slow.load_state_dict(fast.state_dict())
    return fast, slow


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_training_step_has_no_graph_break(gen, backend):
    fast, slow = make_pair()
    check_compiled_step(fast, slow, randn(gen, T, 32), randn(gen, T, 32), backend)


def test_sgd_steps_track_plain_pytorch(gen):
    fast, slow = make_pair()
    check_sgd_steps(fast, slow, randn(gen, 16, 32), randn(gen, 16, 32))
