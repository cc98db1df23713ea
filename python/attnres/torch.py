"""attnres for PyTorch: the runtime's operations as torch.library ops.

Importing this module registers ``torch.ops.attnres.mix``, ``.phase1`` and
``.phase2`` with fake (meta) implementations, so ``torch.compile`` traces
through them without a graph break (``fullgraph=True`` works). On CUDA each
call runs on torch's current stream (``torch.cuda.current_stream()``), so it
is ordered with torch's own work and CUDA graph capture records the launch;
a launch never synchronises or compiles, and the only allocations are the
outputs (and the backward's workspace), from torch's allocator. Plans are made on first use for each
(device, problem) and kept; call :func:`set_database` before the first call to
plan from a tuning database (otherwise the built-in kernels serve).

The ops take the *folded* pseudo-query ``u = gain * w`` as float32 (DESIGN
§1); :class:`AttnResMix` holds ``w`` and ``gain`` as parameters and folds them
per call, so torch's own autograd turns the gradient of ``u`` into those of
``w`` and ``gain``.

Training: ``torch.ops.attnres.mix`` has a backward (DESIGN §1b), registered
with ``torch.library.register_autograd``, that calls the op
``torch.ops.attnres.mix_backward`` (with its fake kernel, so a compiled
training step traces through it). The forward saves only its inputs, the
sources and ``u``; the backward recomputes the RMS statistics and the softmax
weights from them, so no [T, N] tensor is kept between the passes. Gradients
reach the sources, ``u`` (hence ``w`` and ``gain``) and, in the additive form,
``partial``; ``alpha`` is a constant. With the output-norm epilogue the
forward also keeps its output ``out`` (the next layer's input, alive anyway)
and the gain, and the backward takes the gradients of both outputs, out and
normed, and returns that of the gain too.

``torch.ops.attnres.phase1`` and ``.phase2`` train too, through the ops
``torch.ops.attnres.phase1_backward`` and ``.phase2_backward`` (with fake
kernels), which the runtime runs on the CPU and CUDA. phase1's forward
saves the sources and the folded queries; its backward takes the gradients
of o1 and of lse (which phase 2's backward returns) and gives those of the
sources and the queries. phase2's forward saves o1, lse, the partial sum as
it used it (after the fused add) and the query (and out_gain); its backward
gives the gradients of o1, lse, partial, the query, with the fused add of
the sublayer output, and with the epilogue of out_gain. phase2 writes
partial in place when it fuses the add, so its autograd kernel is
registered by hand rather than with ``register_autograd`` (which takes
functional ops only); a partial that the backward needs must not be
changed in place again before the backward (autograd's version check says
so).

Nothing here is imported by ``import attnres``; torch is only needed for this
module.
"""

import ctypes
import sys
import threading
from typing import List, Optional, Tuple

import torch
import torch.utils.dlpack

import attnres

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

_lock = threading.Lock()
_devices = {}
_plans = {}
_db_path = None


def set_database(path):
    """Plans made from now on come from the tuning database at path (None:
    the built-in kernels). Plans already made are kept."""
    global _db_path
    with _lock:
        _db_path = None if path is None else str(path)


def clear_plans():
    """Closes every cached plan and device (e.g. after set_database)."""
    with _lock:
        for plan in _plans.values():
            plan.close()
        for dev in _devices.values():
            dev.close()
        _plans.clear()
        _devices.clear()


def _spec(t: torch.Tensor) -> str:
    if t.device.type == "cpu":
        return "cpu"
    if t.device.type == "cuda":
        return f"cuda:{t.device.index if t.device.index is not None else torch.cuda.current_device()}"
    raise ValueError(f"attnres runs on cpu and cuda tensors, not {t.device}")


def _storage(t: torch.Tensor) -> str:
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise ValueError(f"attnres stores float32, bfloat16 or float16, not {t.dtype}") from None


def plan_for(like: torch.Tensor, **problem) -> attnres.Plan:
    """The cached plan for a problem on like's device (made on first use)."""
    spec = _spec(like)
    key = (spec, tuple(sorted(problem.items())))
    plan = _plans.get(key)
    if plan is not None:
        return plan
    with _lock:
        plan = _plans.get(key)
        if plan is None:
            dev = _devices.get(spec)
            if dev is None:
                dev = _devices[spec] = attnres.open_device(spec)
            if _db_path is not None:
                with attnres.open_db(_db_path) as db:
                    plan = attnres.Plan(dev, db, **problem)
            else:
                plan = attnres.Plan(dev, None, **problem)
            _plans[key] = plan
    return plan


def _stream(t: torch.Tensor):
    """The stream a call on t runs on: torch's current stream for CUDA
    tensors (so launches are ordered with torch's own work and recorded by
    CUDA graph capture), None (nothing) on the CPU."""
    return attnres._torch_current_stream(t) if t.device.type == "cuda" else None


# Tensors go to the plan as DLPack capsules made by torch.utils.dlpack's C
# to_dlpack: Tensor.__dlpack__ is Python code that costs several
# microseconds a tensor, to_dlpack well under one. The capsules keep their
# tensors alive until the call gives them back. They carry no stream
# handshake, and need none: the call runs on torch's current stream.
_capsule = torch.utils.dlpack.to_dlpack


# ---- outputs ------------------------------------------------------------------
# The outputs this module allocates for the ops, a gradient of every source
# above all, are large (528 MB for K3's at T = 4096) and fresh: torch's CPU
# allocator maps them anew, and the kernel's first write then faults them in
# 4 KiB page by page, which took longer than the backward kernel itself
# (217 ms against 87 ms, bench/results/backward-2026-12-06.md). Asking for
# transparent huge pages on them first, where Linux grants them on request
# (THP mode "madvise" or "always"), cut that to 32.5 ms. Only the memory of
# the new tensor is advised, and only whole 2 MiB pages inside it.

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # Linux's value, the same on every architecture


def _find_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_madvise = _find_madvise()


def _empty(like: torch.Tensor, shape, dtype=None) -> torch.Tensor:
    """An uninitialised tensor like `like` (its device and, unless given,
    dtype), with huge pages asked for when it is a CPU tensor of 8 MiB or
    more (a hint: nothing changes where the kernel does not take it)."""
    t = like.new_empty(shape, dtype=dtype if dtype is not None else like.dtype)
    nbytes = t.numel() * t.element_size()
    if _madvise is not None and t.device.type == "cpu" and nbytes >= 4 * _HUGE_PAGE:
        first = (t.data_ptr() + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
        end = (t.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
        if end > first:
            _madvise(first, end - first, _MADV_HUGEPAGE)
    return t


# ---- the ops ----------------------------------------------------------------
# Defined by schema through torch.library.Library, with one implementation
# for every backend (CompositeExplicitAutograd) and a fake kernel for
# tracing. torch.library.custom_op would wrap each call in autograd and
# tracing guards that cost about as much again as the call itself at
# T = 1, so they do without; the mix gets its backward from
# torch.library.register_autograd below instead.

_lib = torch.library.Library("attnres", "DEF")
_lib.define("mix(Tensor[] sources, Tensor query, Tensor? partial, Tensor? out_gain, int heads, float eps, "
            "float scale, float alpha, float out_eps) -> (Tensor, Tensor)")
_lib.define("phase1(Tensor[] sources, Tensor queries, int heads, float eps, float scale) -> (Tensor, Tensor)")
# partial is written in place when sublayer is given (the fused add).
_lib.define("phase2(Tensor o1, Tensor lse, Tensor(a!) partial, Tensor query, Tensor? sublayer, Tensor? out_gain, "
            "float eps, float scale, float out_eps) -> (Tensor, Tensor)")


def mix(sources: List[torch.Tensor], query: torch.Tensor, partial: Optional[torch.Tensor],
        out_gain: Optional[torch.Tensor], heads: int, eps: float, scale: float, alpha: float,
        out_eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The AttnRes mix of N (T, d) sources. Returns (out, normed); normed is
    empty unless out_gain is given (the output-norm epilogue)."""
    s0 = sources[0]
    plan = plan_for(s0, op="mix", dtype=_storage(s0), d=s0.shape[-1], n=len(sources), heads=heads,
                    form="replace" if partial is None else "additive", epilogue=out_gain is not None)
    out = _empty(s0, s0.shape)
    normed = _empty(s0, s0.shape if out_gain is not None else (0,))
    kw = dict(eps=eps, scale=scale, out=_capsule(out), stream=_stream(s0))
    if partial is not None:
        kw.update(partial=_capsule(partial), alpha=alpha)
    if out_gain is not None:
        kw.update(out_gain=_capsule(out_gain), normed=_capsule(normed), out_eps=out_eps)
    plan.mix([_capsule(s) for s in sources], _capsule(query), **kw)
    return out, normed


def _mix_fake(sources, query, partial, out_gain, heads, eps, scale, alpha, out_eps):
    s0 = sources[0]
    out = s0.new_empty(s0.shape)
    return out, (s0.new_empty(s0.shape) if out_gain is not None else s0.new_empty((0,)))


def phase1(sources: List[torch.Tensor], queries: torch.Tensor, heads: int, eps: float,
           scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Block AttnRes phase 1: the S folded queries (S, d) of a block against
    its n (T, d) sources. Returns o1 (S, T, d) and lse (S, T, H) float32."""
    s0 = sources[0]
    sites, (t, d) = queries.shape[0], s0.shape
    plan = plan_for(s0, op="phase1", dtype=_storage(s0), d=d, n=len(sources), heads=heads, sites=sites)
    o1 = _empty(s0, (sites, t, d))
    lse = _empty(s0, (sites, t, heads), dtype=torch.float32)
    plan.phase1([_capsule(s) for s in sources], _capsule(queries), eps=eps, scale=scale, out=_capsule(o1),
                lse=_capsule(lse), stream=_stream(s0))
    return o1, lse


def _phase1_fake(sources, queries, heads, eps, scale):
    s0 = sources[0]
    sites, t, d = queries.shape[0], s0.shape[0], s0.shape[1]
    return s0.new_empty((sites, t, d)), s0.new_empty((sites, t, heads), dtype=torch.float32)


def phase2(o1: torch.Tensor, lse: torch.Tensor, partial: torch.Tensor, query: torch.Tensor,
           sublayer: Optional[torch.Tensor], out_gain: Optional[torch.Tensor], eps: float, scale: float,
           out_eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Block AttnRes phase 2 for one site. With sublayer, partial is first
    updated in place to partial + sublayer. Returns (out, normed); normed is
    empty unless out_gain is given."""
    plan = plan_for(o1, op="phase2", dtype=_storage(o1), d=o1.shape[-1], heads=lse.shape[-1],
                    fuse_add=sublayer is not None, epilogue=out_gain is not None)
    out = _empty(o1, o1.shape)
    normed = _empty(o1, o1.shape if out_gain is not None else (0,))
    kw = dict(eps=eps, scale=scale, out=_capsule(out), stream=_stream(o1))
    if sublayer is not None:
        kw["sublayer"] = _capsule(sublayer)
    if out_gain is not None:
        kw.update(out_gain=_capsule(out_gain), normed=_capsule(normed), out_eps=out_eps)
    plan.phase2(_capsule(o1), _capsule(lse), _capsule(partial), _capsule(query), **kw)
    return out, normed


def _phase2_fake(o1, lse, partial, query, sublayer, out_gain, eps, scale, out_eps):
    return o1.new_empty(o1.shape), (o1.new_empty(o1.shape) if out_gain is not None else o1.new_empty((0,)))


# The mix's backward as an op of its own, so that torch.compile sees one
# opaque call (traced through its fake kernel) in the backward graph. It
# returns dsources as one (N, T, d) tensor, which the autograd formula splits
# into views, the gradient of the folded query u (float32), in the additive
# form the gradients of partial and of alpha, and with the epilogue (out_gain
# given, with the forward's out and dnormed, the gradient of normed) that of
# out_gain (float32); each is empty where the form has none. dout may be None
# with the epilogue: the loss reads normed alone.
_lib.define("mix_backward(Tensor[] sources, Tensor query, Tensor? dout, int heads, bool additive, float eps, "
            "float scale, float alpha, Tensor? out=None, Tensor? out_gain=None, Tensor? dnormed=None, "
            "float out_eps=1e-6) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")


def mix_backward(sources: List[torch.Tensor], query: torch.Tensor, dout: Optional[torch.Tensor], heads: int,
                 additive: bool, eps: float, scale: float, alpha: float, out: Optional[torch.Tensor] = None,
                 out_gain: Optional[torch.Tensor] = None, dnormed: Optional[torch.Tensor] = None,
                 out_eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                 torch.Tensor]:
    """The gradients of the mix (DESIGN §1b) for the gradients dout of its
    output and, with the epilogue, dnormed of normed: (dsources (N, T, d),
    dquery (d,) float32, dpartial (T, d), dalpha (1,) float32, dout_gain
    (d,) float32); dpartial and dalpha are empty in the replacement form,
    dout_gain without the epilogue."""
    s0 = sources[0]
    (t, d), n = s0.shape, len(sources)
    epilogue = out_gain is not None
    plan = plan_for(s0, op="mix_backward", dtype=_storage(s0), d=d, n=n, heads=heads,
                    form="additive" if additive else "replace", epilogue=epilogue)
    dsources, dquery, dpartial, dalpha, dout_gain = _mix_backward_outputs(_empty, s0, n, additive, epilogue)
    kw = dict(eps=eps, scale=scale, dsources=_capsule(dsources), dquery=_capsule(dquery))
    if additive:
        kw.update(alpha=alpha, dpartial=_capsule(dpartial), dalpha=_capsule(dalpha))
    if epilogue:
        kw.update(out=_capsule(out), out_gain=_capsule(out_gain), dnormed=_capsule(dnormed), out_eps=out_eps,
                  dout_gain=_capsule(dout_gain))
    if s0.device.type == "cuda":
        # The runtime's workspace in device memory, from torch's allocator on
        # the stream the launch runs on, so it outlives the launch there.
        workspace = torch.empty(plan.mix_backward_workspace_size(t), dtype=torch.uint8, device=s0.device)
        kw.update(stream=_stream(s0), workspace=_capsule(workspace))
    plan.mix_backward([_capsule(s) for s in sources], _capsule(query), None if dout is None else _capsule(dout), **kw)
    return dsources, dquery, dpartial, dalpha, dout_gain


def _mix_backward_outputs(empty, s0, n, additive, epilogue):
    """The backward's five outputs, made by empty(like, shape, dtype=None)."""
    t, d = s0.shape
    f32 = torch.float32
    return (empty(s0, (n, t, d)), empty(s0, (d,), dtype=f32), empty(s0, (t, d) if additive else (0,)),
            empty(s0, (1,) if additive else (0,), dtype=f32), empty(s0, (d,) if epilogue else (0,), dtype=f32))


def _mix_backward_fake(sources, query, dout, heads, additive, eps, scale, alpha, out=None, out_gain=None,
                       dnormed=None, out_eps=1e-6):
    return _mix_backward_outputs(lambda like, shape, dtype=None: like.new_empty(shape, dtype=dtype or like.dtype),
                                 sources[0], len(sources), additive, out_gain is not None)


# The backwards of Block AttnRes' two phases as ops of their own, for the
# same reason. phase1_backward takes every site's gradient of o1 (S, T, d)
# and of lse (S, T, H) float32, or None for zero, and returns dsources as
# one (N, T, d) tensor and the gradient of the S folded queries (S, d)
# float32. phase2_backward takes phase 2's inputs, partial as the forward
# used it (with the fused add: partial after the add), and the gradients of
# out and, with the epilogue (out_gain given, with dnormed), of normed; it
# returns the gradients of o1, lse (float32), partial, the sublayer output
# (with fuse_add: the same values as partial's; else empty), the folded
# query (float32) and out_gain (float32; empty without the epilogue). The
# runtime runs both on the CPU only for now: a CUDA tensor gets its refusal
# (EUNSUPPORTED) when the plan is made.
_lib.define("phase1_backward(Tensor[] sources, Tensor queries, Tensor do1, Tensor? dlse, int heads, float eps, "
            "float scale) -> (Tensor, Tensor)")
_lib.define("phase2_backward(Tensor o1, Tensor lse, Tensor partial, Tensor query, Tensor? dout, bool fuse_add, "
            "float eps, float scale, Tensor? out_gain=None, Tensor? dnormed=None, float out_eps=1e-6) -> "
            "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")


def _device_kw(plan, like, t):
    """A CUDA call's stream and workspace (from torch's allocator on the
    stream the launch runs on, so it outlives the launch there); nothing on
    the CPU, where the plan's scratch serves."""
    if like.device.type != "cuda":
        return {}
    workspace = torch.empty(plan.workspace_size(t), dtype=torch.uint8, device=like.device)
    return dict(stream=_stream(like), workspace=_capsule(workspace))


def phase1_backward(sources: List[torch.Tensor], queries: torch.Tensor, do1: torch.Tensor,
                    dlse: Optional[torch.Tensor], heads: int, eps: float,
                    scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gradients of phase 1 for the gradients do1 (S, T, d) of o1 and
    dlse (S, T, H) of lse (None: zero): (dsources (N, T, d), each source's
    summed over the sites, dqueries (S, d) float32)."""
    s0 = sources[0]
    n, sites = len(sources), queries.shape[0]
    plan = plan_for(s0, op="phase1_backward", dtype=_storage(s0), d=s0.shape[-1], n=n, heads=heads, sites=sites)
    dsources, dqueries = _phase1_backward_outputs(_empty, s0, n, sites)
    plan.phase1_backward([_capsule(s) for s in sources], _capsule(queries), _capsule(do1),
                         None if dlse is None else _capsule(dlse), eps=eps, scale=scale,
                         dsources=_capsule(dsources), dqueries=_capsule(dqueries),
                         **_device_kw(plan, s0, s0.shape[0]))
    return dsources, dqueries


def _phase1_backward_outputs(empty, s0, n, sites):
    t, d = s0.shape
    return empty(s0, (n, t, d)), empty(s0, (sites, d), dtype=torch.float32)


def _phase1_backward_fake(sources, queries, do1, dlse, heads, eps, scale):
    return _phase1_backward_outputs(lambda like, shape, dtype=None: like.new_empty(shape, dtype=dtype or like.dtype),
                                    sources[0], len(sources), queries.shape[0])


def phase2_backward(o1: torch.Tensor, lse: torch.Tensor, partial: torch.Tensor, query: torch.Tensor,
                    dout: Optional[torch.Tensor], fuse_add: bool, eps: float, scale: float,
                    out_gain: Optional[torch.Tensor] = None, dnormed: Optional[torch.Tensor] = None,
                    out_eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                    torch.Tensor, torch.Tensor]:
    """The gradients of phase 2 for one site: (do1 (T, d), dlse (T, H)
    float32, dpartial (T, d), dsublayer (T, d) with fuse_add else empty,
    dquery (d,) float32, dout_gain (d,) float32 with the epilogue else
    empty). partial is the partial sum as the forward used it (after the
    fused add)."""
    (t, d), heads = o1.shape, lse.shape[-1]
    epilogue = out_gain is not None
    plan = plan_for(o1, op="phase2_backward", dtype=_storage(o1), d=d, heads=heads, fuse_add=fuse_add,
                    epilogue=epilogue)
    do1, dlse, dpartial, dsublayer, dquery, dout_gain = _phase2_backward_outputs(_empty, o1, heads, fuse_add,
                                                                                  epilogue)
    kw = dict(eps=eps, scale=scale, do1=_capsule(do1), dlse=_capsule(dlse), dpartial=_capsule(dpartial),
              dquery=_capsule(dquery), **_device_kw(plan, o1, t))
    if fuse_add:
        kw["dsublayer"] = _capsule(dsublayer)
    if epilogue:
        kw.update(out_gain=_capsule(out_gain), dnormed=_capsule(dnormed), out_eps=out_eps,
                  dout_gain=_capsule(dout_gain))
    plan.phase2_backward(_capsule(o1), _capsule(lse), _capsule(partial), _capsule(query),
                         None if dout is None else _capsule(dout), **kw)
    return do1, dlse, dpartial, dsublayer, dquery, dout_gain


def _phase2_backward_outputs(empty, o1, heads, fuse_add, epilogue):
    t, d = o1.shape
    f32 = torch.float32
    return (empty(o1, (t, d)), empty(o1, (t, heads), dtype=f32), empty(o1, (t, d)),
            empty(o1, (t, d) if fuse_add else (0,)), empty(o1, (d,), dtype=f32),
            empty(o1, (d,) if epilogue else (0,), dtype=f32))


def _phase2_backward_fake(o1, lse, partial, query, dout, fuse_add, eps, scale, out_gain=None, dnormed=None,
                          out_eps=1e-6):
    return _phase2_backward_outputs(lambda like, shape, dtype=None: like.new_empty(shape, dtype=dtype or like.dtype),
                                    o1, lse.shape[-1], fuse_add, out_gain is not None)


for _name, _impl, _fake in (("mix", mix, _mix_fake), ("phase1", phase1, _phase1_fake),
                            ("phase2", phase2, _phase2_fake), ("mix_backward", mix_backward, _mix_backward_fake),
                            ("phase1_backward", phase1_backward, _phase1_backward_fake),
                            ("phase2_backward", phase2_backward, _phase2_backward_fake)):
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"attnres::{_name}", _fake, lib=_lib)


# ---- autograd for the mix ---------------------------------------------------------


def _mix_setup_context(ctx, inputs, output):
    sources, query, partial, out_gain, heads, eps, scale, alpha, out_eps = inputs
    # Only the inputs are kept: the backward recomputes the weights from
    # them. The epilogue's backward also needs the output it normalised.
    ctx.heads, ctx.eps, ctx.scale, ctx.alpha, ctx.out_eps = heads, eps, scale, alpha, out_eps
    ctx.additive, ctx.epilogue = partial is not None, out_gain is not None
    if ctx.epilogue:
        ctx.save_for_backward(*sources, query, output[0], out_gain)
    else:
        ctx.save_for_backward(*sources, query)


def _mix_autograd_backward(ctx, grad_out, grad_normed):
    saved = list(ctx.saved_tensors)
    out = out_gain = dnormed = None
    if ctx.epilogue:
        out, out_gain = saved[-2], saved[-1]
        saved = saved[:-2]
        dnormed = torch.zeros_like(out) if grad_normed is None else grad_normed.contiguous()
    *sources, query = saved
    # The kernels read dout with unit element stride; autograd may hand over
    # an expanded or transposed gradient (the backward of a sum is one). With
    # the epilogue a loss that reads normed alone passes no dout at all.
    dout = None if grad_out is None else grad_out.contiguous()
    if dout is None and not ctx.epilogue:
        dout = torch.zeros_like(sources[0])
    dsources, dquery, dpartial, _, dout_gain = torch.ops.attnres.mix_backward(
        sources, query, dout, ctx.heads, ctx.additive, ctx.eps, ctx.scale, ctx.alpha, out, out_gain, dnormed,
        ctx.out_eps)
    return (list(dsources.unbind(0)), dquery, dpartial if ctx.additive else None,
            dout_gain if ctx.epilogue else None, None, None, None, None, None)


torch.library.register_autograd("attnres::mix", _mix_autograd_backward, setup_context=_mix_setup_context, lib=_lib)


# ---- autograd for the two phases --------------------------------------------------


def _phase1_setup_context(ctx, inputs, output):
    sources, queries, heads, eps, scale = inputs
    # As the mix's: only the inputs are kept, the weights are recomputed.
    ctx.heads, ctx.eps, ctx.scale = heads, eps, scale
    ctx.save_for_backward(*sources, queries)


def _phase1_autograd_backward(ctx, grad_o1, grad_lse):
    *sources, queries = ctx.saved_tensors
    # do1 is needed (zeros where the loss reads no o1); dlse may be None, as
    # for a block's first site, which has no phase 2. The kernels read both
    # with unit element stride.
    if grad_o1 is None:
        grad_o1 = sources[0].new_zeros((queries.shape[0], *sources[0].shape))
    dsources, dqueries = torch.ops.attnres.phase1_backward(
        sources, queries, grad_o1.contiguous(), None if grad_lse is None else grad_lse.contiguous(), ctx.heads,
        ctx.eps, ctx.scale)
    return list(dsources.unbind(0)), dqueries, None, None, None


torch.library.register_autograd("attnres::phase1", _phase1_autograd_backward, setup_context=_phase1_setup_context,
                                lib=_lib)


# phase2 writes partial in place when it fuses the add (Tensor(a!) in its
# schema), and torch.library.register_autograd takes only functional ops.
# So its Autograd kernel is registered here by hand, as register_autograd's
# own (torch._library.autograd.make_autograd_impl) would be: an
# autograd.Function whose forward runs the op below autograd. With the fused
# add the Function marks partial dirty and returns it as a third output, so
# autograd rebases partial's history onto the op (bumping its version): the
# gradient that reaches partial after the add is added to the op's gradient
# of b, which then flows to partial before the add and to the sublayer
# output. The backward needs partial after the add, so a later in-place
# change to it before the backward is an error (autograd's version check),
# as for any tensor a backward saved.

_phase2_op = torch.ops.attnres.phase2.default


class _Phase2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, keyset, o1, lse, partial, query, sublayer, out_gain, eps, scale, out_eps):
        # An output no loss reached comes to backward as None, not as zeros
        # autograd would make: with the fused add partial is an output, and
        # adding its zero gradient to dpartial and dsublayer cost two full
        # (T, d) passes (bench/results/phase-backward-2026-12-07.md).
        ctx.set_materialize_grads(False)
        with torch._C._AutoDispatchBelowAutograd():
            out, normed = _phase2_op.redispatch(keyset & torch._C._after_autograd_keyset, o1, lse, partial, query,
                                                sublayer, out_gain, eps, scale, out_eps)
        ctx.fused, ctx.epilogue = sublayer is not None, out_gain is not None
        ctx.eps, ctx.scale, ctx.out_eps = eps, scale, out_eps
        if ctx.epilogue:
            ctx.save_for_backward(o1, lse, partial, query, out_gain)
        else:
            ctx.save_for_backward(o1, lse, partial, query)
        if ctx.fused:
            ctx.mark_dirty(partial)
            return out, normed, partial
        return out, normed

    @staticmethod
    def backward(ctx, grad_out, grad_normed, grad_partial=None):
        o1, lse, partial, query, *rest = ctx.saved_tensors
        out_gain = rest[0] if ctx.epilogue else None
        dout = None if grad_out is None else grad_out.contiguous()
        if dout is None and not ctx.epilogue:
            dout = torch.zeros_like(o1)
        dnormed = None
        if ctx.epilogue:
            dnormed = torch.zeros_like(o1) if grad_normed is None else grad_normed.contiguous()
        do1, dlse, dpartial, dsublayer, dquery, dout_gain = torch.ops.attnres.phase2_backward(
            o1, lse, partial, query, dout, ctx.fused, ctx.eps, ctx.scale, out_gain, dnormed, ctx.out_eps)
        if grad_partial is not None:
            # partial after the add was also read elsewhere.
            dpartial = dpartial + grad_partial
            dsublayer = dsublayer + grad_partial
        return (None, do1, dlse, dpartial, dquery, dsublayer if ctx.fused else None,
                dout_gain if ctx.epilogue else None, None, None, None)


def _phase2_autograd(keyset, o1, lse, partial, query, sublayer, out_gain, eps, scale, out_eps):
    if torch.is_grad_enabled() and torch._C._any_requires_grad(o1, lse, partial, query, sublayer, out_gain):
        if sublayer is not None and partial._is_view():
            # autograd rebases a view modified in place by a Function only
            # when the Function has one output: here torch's own add_ does
            # the fused add, and the op runs (forward and backward) unfused.
            partial.add_(sublayer)
            sublayer = None
        result = _Phase2.apply(keyset, o1, lse, partial, query, sublayer, out_gain, eps, scale, out_eps)
        return result[0], result[1]
    with torch._C._AutoDispatchBelowAutograd():
        return _phase2_op.redispatch(keyset & torch._C._after_autograd_keyset, o1, lse, partial, query, sublayer,
                                     out_gain, eps, scale, out_eps)


_lib.impl("phase2", _phase2_autograd, "Autograd", with_keyset=True)


# ---- one routing site as a module ---------------------------------------------


class AttnResMix(torch.nn.Module):
    """One AttnRes routing site: holds the pseudo-query w and the RMSNorm gain
    (and, with epilogue=True, the next sublayer's PreNorm gain) and mixes N
    sources of shape (..., d). forward(sources, partial=None) returns out, or
    (out, normed) with the epilogue; partial switches to the additive form
    (Delta AttnRes: out = partial + alpha * mix). It trains: gradients reach
    the sources, partial, query and gain, and out_gain with the epilogue."""

    def __init__(self, d: int, heads: int = 1, eps: float = 1e-6, scale: float = 1.0, alpha: float = 1.0,
                 epilogue: bool = False, out_eps: float = 1e-6, device=None):
        super().__init__()
        if d < 1 or heads < 1 or d % heads:
            raise ValueError(f"heads ({heads}) must divide d ({d})")
        self.d, self.heads, self.eps, self.scale, self.alpha, self.out_eps = d, heads, eps, scale, alpha, out_eps
        # The paper initialises pseudo-queries to zero (uniform weights at start).
        self.query = torch.nn.Parameter(torch.zeros(d, device=device))
        self.gain = torch.nn.Parameter(torch.ones(d, device=device))
        self.out_gain = torch.nn.Parameter(torch.ones(d, device=device)) if epilogue else None

    def forward(self, sources, partial: Optional[torch.Tensor] = None):
        if isinstance(sources, torch.Tensor):
            sources = list(sources.unbind(0))
        shape = sources[0].shape
        rows = [s.reshape(-1, self.d) for s in sources]
        u = (self.query * self.gain).float()
        part = partial.reshape(-1, self.d) if partial is not None else None
        og = self.out_gain.float() if self.out_gain is not None else None
        out, normed = torch.ops.attnres.mix(rows, u, part, og, self.heads, self.eps, self.scale, self.alpha,
                                            self.out_eps)
        if og is not None:
            return out.reshape(shape), normed.reshape(shape)
        return out.reshape(shape)
