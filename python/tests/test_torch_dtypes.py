"""bf16 and f16 through torch tensors (NumPy has no bfloat16), and outputs
allocated as torch tensors. Skipped, saying so, when torch is not installed."""

import numpy as np
import pytest

import attnres
from conftest import TOL, reference, rel_err, tolist

torch = pytest.importorskip("torch", reason="torch is not installed: bf16/f16 through torch not tested here")

D, N, T = 32, 3, 4
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("as_views", [False, True])
def test_mix_16_bit_through_torch(dev, dtype, as_views):
    gen = torch.Generator().manual_seed(3)
    src = torch.randn(N, T, D, generator=gen).to(TORCH[dtype])
    q = torch.randn(D, generator=gen)
    plan = attnres.Plan(dev, None, dtype=dtype, d=D, n=N, heads=2)
    sources = [torch.randn(T, 2 * D).to(TORCH[dtype])[:, :D].copy_(src[i]) for i in range(N)] if as_views else src
    out = plan.mix(sources, q)
    assert isinstance(out, torch.Tensor) and out.dtype == TORCH[dtype] and out.shape == (T, D)
    ref, _ = reference.mix(tolist(src.float()), tolist(q), heads=2)
    assert rel_err(out.float(), ref) <= TOL[dtype]


def test_phase1_bf16_through_torch(dev):
    src = torch.randn(2, T, D).bfloat16()
    qs = torch.randn(2, D)
    plan = attnres.Plan(dev, None, op="phase1", dtype="bf16", d=D, n=2, sites=2)
    o1, lse = plan.phase1(src, qs)
    assert o1.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref_o1, ref_lse = reference.phase1(tolist(src.float()), tolist(qs))
    assert rel_err(o1.float(), ref_o1) <= TOL["bf16"]
    assert rel_err(lse, ref_lse) <= 1e-3
