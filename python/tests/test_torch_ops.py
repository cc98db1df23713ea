"""The attnres.torch ops (torch.ops.attnres.mix, .phase1, .phase2) and the
AttnResMix module against a plain PyTorch implementation of DESIGN §1 in
float64, for every form, epilogue and head count in f32, bf16 and f16; the
fake (meta) kernels through torch.library.opcheck; and torch.compile with
fullgraph=True over a function that calls the ops, which fails on any graph
break. Skipped, saying so, when torch is not installed."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the attnres.torch ops are not tested here")

import attnres.torch as art  # noqa: E402

D, N, T = 64, 5, 7
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# DESIGN §1: fp32 to 1e-5, 16-bit storage to 1e-2, against the reference of the rounded inputs.
TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 1e-2}


# ---- DESIGN §1 in plain PyTorch, float64 -------------------------------------


def scores(v, u, heads, eps, scale):
    """s[n, t, h] = scale * sum over head h of r_n * v_n[k] * u[k], r_n over the full row."""
    n, t, d = v.shape
    r = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return scale * (r * v * u).reshape(n, t, heads, d // heads).sum(-1)


def by_head(x, heads):
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads)


def rms_norm(x, gain, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def plain_mix(sources, u, heads=1, eps=1e-6, scale=1.0, partial=None, alpha=1.0, out_gain=None, out_eps=1e-6):
    v = torch.stack([s.double() for s in sources])
    u = u.double()
    weights = torch.softmax(scores(v, u, heads, eps, scale), dim=0)
    mix = (weights.unsqueeze(-1) * by_head(v, heads)).sum(0).reshape(v.shape[1:])
    out = mix if partial is None else partial.double() + alpha * mix
    return out, (rms_norm(out, out_gain.double(), out_eps) if out_gain is not None else None)


def plain_phase1(sources, queries, heads=1, eps=1e-6, scale=1.0):
    v = torch.stack([s.double() for s in sources])
    o1, lse = [], []
    for u in queries.double():
        s = scores(v, u, heads, eps, scale)
        o1.append((torch.softmax(s, dim=0).unsqueeze(-1) * by_head(v, heads)).sum(0).reshape(v.shape[1:]))
        lse.append(torch.logsumexp(s, dim=0))
    return torch.stack(o1), torch.stack(lse)


def plain_phase2(o1, lse, b, u, heads=1, eps=1e-6, scale=1.0, sublayer=None, out_gain=None, out_eps=1e-6):
    b = b.double() if sublayer is None else b.double() + sublayer.double()
    s2 = scores(b.unsqueeze(0), u.double(), heads, eps, scale)[0]
    p2 = torch.sigmoid(s2 - lse.double()).unsqueeze(-1)
    o1 = by_head(o1.double(), heads)
    out = (o1 + p2 * (by_head(b, heads) - o1)).reshape(b.shape)
    return out, (rms_norm(out, out_gain.double(), out_eps) if out_gain is not None else None), b


def rel_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / (want.norm() or 1.0))


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(2026)


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


# ---- the plain implementation is DESIGN §1 -------------------------------------


def test_the_plain_implementation_agrees_with_the_project_reference(gen):
    # The project's own fp64 oracle (tests/cli/reference.py), so that the
    # comparisons below are against the normative definition twice over.
    from conftest import reference
    v, u, b = randn(gen, 3, 2, 8), randn(gen, 8), randn(gen, 2, 8)
    out, _ = plain_mix(list(v), u, heads=2, eps=1e-5, scale=0.7)
    want, _ = reference.mix(v.double().tolist(), u.double().tolist(), heads=2, eps=1e-5, scale=0.7)
    assert rel_err(out, torch.tensor(want, dtype=torch.float64)) < 1e-12
    o1, lse = plain_phase1(list(v), u.unsqueeze(0), heads=2)
    want_o1, want_lse = reference.phase1(v.double().tolist(), [u.double().tolist()], heads=2)
    assert rel_err(o1, torch.tensor(want_o1, dtype=torch.float64)) < 1e-12 and rel_err(lse, torch.tensor(want_lse, dtype=torch.float64)) < 1e-12
    out2, _, _ = plain_phase2(o1[0], lse[0], b, u, heads=2)
    want2, _, _ = reference.phase2(o1[0].tolist(), lse[0].tolist(), b.double().tolist(), u.double().tolist(),
                                   heads=2)
    assert rel_err(out2, torch.tensor(want2, dtype=torch.float64)) < 1e-12


# ---- the ops against it -------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("additive", [False, True], ids=["replace", "additive"])
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "epilogue"])
def test_mix_op(gen, dtype, heads, additive, epilogue):
    dt = DTYPES[dtype]
    sources = [randn(gen, T, D, dtype=dt) for _ in range(N)]
    u = randn(gen, D)
    partial = randn(gen, T, D, dtype=dt) if additive else None
    og = (1 + 0.1 * randn(gen, D)) if epilogue else None
    out, normed = torch.ops.attnres.mix(sources, u, partial, og, heads, 1e-5, 0.8, 0.5, 1e-6)
    want, want_normed = plain_mix(sources, u, heads, 1e-5, 0.8, partial, 0.5, og, 1e-6)
    assert out.dtype == dt and out.shape == (T, D)
    assert rel_err(out, want) <= TOL[dtype]
    if epilogue:
        assert normed.dtype == dt and rel_err(normed, want_normed) <= TOL[dtype]
    else:
        assert normed.numel() == 0


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("heads", [1, 2])
def test_phase1_op(gen, dtype, heads):
    dt = DTYPES[dtype]
    sources = [randn(gen, T, D, dtype=dt) for _ in range(N)]
    queries = randn(gen, 3, D)
    o1, lse = torch.ops.attnres.phase1(sources, queries, heads, 1e-5, 1.2)
    want_o1, want_lse = plain_phase1(sources, queries, heads, 1e-5, 1.2)
    assert o1.dtype == dt and o1.shape == (3, T, D) and lse.dtype == torch.float32 and lse.shape == (3, T, heads)
    assert rel_err(o1, want_o1) <= TOL[dtype]
    assert rel_err(lse, want_lse) <= 1e-5


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("fuse_add", [False, True], ids=["b", "b+f"])
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "epilogue"])
def test_phase2_op(gen, dtype, fuse_add, epilogue):
    dt, heads = DTYPES[dtype], 2
    o1, b = randn(gen, T, D, dtype=dt), randn(gen, T, D, dtype=dt)
    lse = randn(gen, T, heads)
    u = randn(gen, D)
    f = randn(gen, T, D, dtype=dt) if fuse_add else None
    og = (1 + 0.1 * randn(gen, D)) if epilogue else None
    b0 = b.clone()
    out, normed = torch.ops.attnres.phase2(o1, lse, b, u, f, og, 1e-5, 0.9, 1e-6)
    want, want_normed, want_b = plain_phase2(o1, lse, b0, u, heads, 1e-5, 0.9, f, og, 1e-6)
    assert out.dtype == dt and rel_err(out, want) <= TOL[dtype]
    if epilogue:
        assert rel_err(normed, want_normed) <= TOL[dtype]
    if fuse_add:  # partial is updated in place to b + f
        assert rel_err(b, want_b) <= TOL[dtype]
    else:
        assert torch.equal(b, b0)


def test_phase1_then_phase2_ops_equal_the_mix_op(gen):
    heads = 2
    sources = [randn(gen, T, D) for _ in range(N)]
    b = randn(gen, T, D)
    queries = randn(gen, 2, D)
    o1, lse = torch.ops.attnres.phase1(sources, queries, heads, 1e-6, 1.0)
    for j in range(2):
        out, _ = torch.ops.attnres.phase2(o1[j], lse[j], b, queries[j], None, None, 1e-6, 1.0, 1e-6)
        want, _ = torch.ops.attnres.mix(sources + [b], queries[j], None, None, heads, 1e-6, 1.0, 1.0, 1e-6)
        assert rel_err(out, want) <= 1e-5


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_attnres_mix_module(gen, dtype):
    dt = DTYPES[dtype]
    site = art.AttnResMix(D, heads=4, eps=1e-5, epilogue=True)
    with torch.no_grad():
        site.query.copy_(randn(gen, D))
        site.gain.copy_(1 + 0.1 * randn(gen, D))
        site.out_gain.copy_(1 + 0.1 * randn(gen, D))
    # Sources of shape (batch, seq, d), as a model holds them.
    sources = torch.stack([randn(gen, 2, 3, D, dtype=dt) for _ in range(N)])
    with torch.no_grad():
        out, normed = site(sources)
    rows = [s.reshape(-1, D) for s in sources]
    want, want_normed = plain_mix(rows, site.query.detach() * site.gain.detach(), 4, 1e-5, 1.0, None, 1.0,
                                  site.out_gain.detach(), 1e-6)
    assert out.shape == (2, 3, D) and out.dtype == dt
    assert rel_err(out.reshape(-1, D), want) <= TOL[dtype]
    assert rel_err(normed.reshape(-1, D), want_normed) <= TOL[dtype]


# ---- the fake kernels and torch.compile ------------------------------------------


def test_fake_kernels_agree_with_the_real_ones(gen):
    # opcheck runs each op for real and through its fake kernel (and the
    # schema's mutation claims) and fails on any disagreement.
    sources = [randn(gen, T, D, dtype=torch.bfloat16) for _ in range(3)]
    u, og = randn(gen, D), 1 + 0.1 * randn(gen, D)
    partial = randn(gen, T, D, dtype=torch.bfloat16)
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.attnres.mix.default, (sources, u, partial, og, 2, 1e-6, 1.0, 0.5, 1e-6),
                          test_utils=checks)
    torch.library.opcheck(torch.ops.attnres.mix.default, (sources, u, None, None, 1, 1e-6, 1.0, 1.0, 1e-6),
                          test_utils=checks)
    torch.library.opcheck(torch.ops.attnres.phase1.default, (sources, randn(gen, 4, D), 2, 1e-6, 1.0),
                          test_utils=checks)
    o1, lse = randn(gen, T, D, dtype=torch.bfloat16), randn(gen, T, 2)
    torch.library.opcheck(torch.ops.attnres.phase2.default,
                          (o1, lse, partial.clone(), u, randn(gen, T, D, dtype=torch.bfloat16), og, 1e-6, 1.0, 1e-6),
                          test_utils=checks)


def block(sources, queries, b, f, og):
    """Two sites of a Block AttnRes block: phase 1 for both, then phase 2
    with the fused add and the epilogue, then a plain mix, with torch
    arithmetic between them."""
    o1, lse = torch.ops.attnres.phase1(sources, queries, 2, 1e-5, 1.0)
    out0, normed0 = torch.ops.attnres.phase2(o1[0], lse[0], b, queries[0], f, og, 1e-5, 1.0, 1e-6)
    h = normed0 * 0.5 + 1.0
    out1, _ = torch.ops.attnres.mix(sources + [h], queries[1], None, None, 2, 1e-5, 1.0, 1.0, 1e-6)
    return out0, out1 - h


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_torch_compile_fullgraph_has_no_graph_break(gen, backend):
    torch._dynamo.reset()
    sources = [randn(gen, T, D) for _ in range(N)]
    queries = randn(gen, 2, D)
    b, f = randn(gen, T, D), randn(gen, T, D)
    og = 1 + 0.1 * randn(gen, D)
    b_eager = b.clone()
    want = block(sources, queries, b_eager, f, og)
    explanation = torch._dynamo.explain(block)(sources, queries, b.clone(), f, og)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
    # fullgraph=True raises on any graph break rather than splitting the graph.
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    got = compiled(sources, queries, b, f, og)
    for g, w in zip(got, want):
        assert rel_err(g, w) <= 1e-5
    assert torch.equal(b, b_eager), "the fused add must update partial in place under compile too"


def test_ops_on_strided_views_and_tensors_that_require_grad(gen):
    # Sources as the engine's bank holds them: row blocks of one buffer,
    # each a (T, d) view with token stride N * d; and a pseudo-query that
    # is a product of parameters (it requires grad).
    bank = randn(gen, T, N, D, dtype=torch.bfloat16)
    sources = list(bank.unbind(1))
    assert sources[0].stride() == (N * D, 1)
    w = torch.nn.Parameter(randn(gen, D))
    g = torch.nn.Parameter(1 + 0.1 * randn(gen, D))
    u = w * g
    assert u.requires_grad
    out, _ = torch.ops.attnres.mix(sources, u, None, None, 2, 1e-6, 1.0, 1.0, 1e-6)
    want, _ = plain_mix(sources, u.detach(), 2)
    assert rel_err(out, want) <= TOL["bf16"]


# ---- the stream a CUDA call runs on ---------------------------------------------


def asks_torch_for_its_current_stream(fn):
    """fn() must return torch's current CUDA stream; without a GPU, torch
    saying it has no driver shows that the call got as far as asking it."""
    if torch.cuda.is_available():
        assert fn() == torch.cuda.current_stream().cuda_stream
    else:
        with pytest.raises((RuntimeError, AssertionError), match="NVIDIA|CUDA|cuda"):
            fn()


def test_the_stream_of_cpu_tensors_is_none_and_of_cuda_tensors_torchs_current_one():
    import attnres

    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu = torch.ones(2, 4)
    assert art._stream(cpu) is None
    # A CUDA tensor: a fake one, so that no GPU is needed to make it.
    with FakeTensorMode():
        on_cuda = torch.empty(2, 4, device="cuda")
    asks_torch_for_its_current_stream(lambda: art._stream(on_cuda))
    with attnres.open_device("cpu") as dev:
        assert attnres._stream(None, [cpu, cpu], dev) == 0
        # Alone, or first of a sequence of sources.
        asks_torch_for_its_current_stream(lambda: attnres._stream(None, on_cuda, dev))
        asks_torch_for_its_current_stream(lambda: attnres._stream(None, [on_cuda, on_cuda], dev))
