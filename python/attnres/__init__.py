"""attnres: Attention Residuals depth mixing through libattnres.

At model load, open a device and (optionally) a tuning database and plan each
routing site; on the hot path call the plan with arrays from any library that
speaks DLPack (NumPy, torch, CuPy, JAX). Arrays are read in place, with their
strides; nothing is copied::

    import attnres, numpy as np
    dev = attnres.open_device("cpu")
    plan = attnres.Plan(dev, None, dtype="f32", d=512, n=9)
    out = plan.mix(sources, query, eps=1e-5)      # sources: (9, T, 512)

torch is only imported by ``attnres.torch``.
"""

from . import _core
from ._core import ArgumentError, Db, Device, Error, Plan, device_count, miss_file_set, open_db, open_device

__version__ = _core.version()
__all__ = ["ArgumentError", "Db", "Device", "Error", "Plan", "device_count", "miss_file_set", "open_db",
           "open_device", "__version__"]

# Storage names of the runtime and the NumPy / torch element types they are.
_NUMPY_DTYPES = {"f32": "float32", "f16": "float16"}
_TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def _is_torch(obj):
    return type(obj).__module__.split(".", 1)[0] == "torch"


def _empty(like, shape, dtype, device):
    """Allocates an output for a plan call: a torch tensor on like's device
    when the inputs are torch tensors, a CuPy array for CuPy inputs, else a
    NumPy array (CPU plans only)."""
    if _is_torch(like):
        import torch

        return torch.empty(shape, dtype=getattr(torch, _TORCH_DTYPES[dtype]), device=like.device)
    if type(like).__module__.split(".", 1)[0] == "cupy":
        import cupy

        return cupy.empty(shape, dtype=_NUMPY_DTYPES.get(dtype, "float32"))
    if device.spec.startswith("cuda"):
        raise ValueError("no output library for these inputs on a CUDA plan: pass out= (and normed=, lse=)")
    if dtype not in _NUMPY_DTYPES:
        raise ValueError("NumPy has no bfloat16: pass out= (and normed=), or use torch tensors")
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ValueError("allocating outputs for these inputs needs NumPy: pass out= or install numpy") from e
    return numpy.empty(shape, dtype=_NUMPY_DTYPES[dtype])


def _torch_current_stream(tensor):
    """The CUstream of torch's current stream on a CUDA tensor's device: the
    stream torch itself would launch on now, which during CUDA graph
    capture is the capturing stream."""
    import torch

    return torch.cuda.current_stream(tensor.device).cuda_stream


def _stream(stream, like, device):
    """The CUstream (an int) a CUDA call runs on: stream= as an int, a torch
    or CuPy stream object, or else the current stream of the inputs'
    library (torch, for CUDA tensors; CuPy), or else 0, the default stream.
    Inputs on another device get 0 here and are refused by the device check
    with a message that names them."""
    if isinstance(like, (list, tuple)) and like:
        like = like[0]  # sources given as a sequence of views
    if stream is None:
        if _is_torch(like):
            return _torch_current_stream(like) if like.device.type == "cuda" else 0
        if type(like).__module__.split(".", 1)[0] == "cupy":
            import cupy

            return cupy.cuda.get_current_stream().ptr
        return 0
    if isinstance(stream, bool):
        raise ValueError("stream= must be a CUstream as an int, or a torch or CuPy stream")
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise ValueError("stream= must be a CUstream as an int, or a torch or CuPy stream")


_core._set_helpers(_empty, _stream)
