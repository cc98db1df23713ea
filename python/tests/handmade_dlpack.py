"""DLPack 1.x capsules built field by field with ctypes, as a C library
would export them: any data pointer (host memory, or a device buffer of the
CUDA driver), device, dtype, version and flags. The struct lives as long as
the exporting object, and the capsule has no deleter to run."""

import ctypes

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

capsule_name = ctypes.pythonapi.PyCapsule_GetName
capsule_name.restype = ctypes.c_char_p
capsule_name.argtypes = [ctypes.py_object]

DL_CPU, DL_CUDA = 1, 2
FLOAT32 = (2, 32)  # DLPack type code kDLFloat, 32 bits


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class Exported:
    """A compact row-major array at address `data`, exported through a
    hand-made versioned capsule. `calls` keeps the keywords of every
    __dlpack__ call, so that a test can see which stream it was asked for."""

    def __init__(self, data, shape, device=(DL_CPU, 0), dtype=FLOAT32, major=1, minor=0, flags=0, keep=None):
        self.keep = keep  # whatever owns the memory
        self.shape = tuple(shape)
        self.dl_device = device
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self.tensor = DLManagedTensorVersioned(major, minor, None, None, flags, DLTensor(
            data, device[0], device[1], len(shape), dtype[0], dtype[1], 1, self._shape, None, 0))
        self.calls = []

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        # Like any producer of versioned capsules only, this one refuses a
        # consumer that does not ask for them; it does not look further at
        # max_version, so that a test can hand over a later major version.
        self.calls.append({"stream": stream, "max_version": max_version})
        if max_version is None:
            raise BufferError("this producer exports DLPack 1.x capsules only")
        return _capsule_new(ctypes.addressof(self.tensor), b"dltensor_versioned", None)

    def __dlpack_device__(self):
        return self.dl_device


def from_numpy(array, **kw):
    """A C-contiguous NumPy array's memory exported by hand."""
    assert array.flags.c_contiguous
    return Exported(array.ctypes.data, array.shape, keep=array, **kw)
