"""The extension's CUDA path without a GPU. The project's simulated CUDA
driver (tests/cudasim, DESIGN §8) stands in for libcuda.so.1, so a plan on
"cuda:0" runs the shipping CUDA backend on NVRTC's PTX. Arrays are device
buffers of that same driver (cuMemAlloc through ctypes) exported as
hand-made DLPack capsules of device type CUDA. Shown here: the stream a call
runs on (stream= as an int, as an object with .cuda_stream like a
torch.cuda.Stream, or the default stream), that every producer is asked for
that stream through __dlpack__(stream=...), results against the CPU, and
the device checks. Not shown (they need a GPU and torch's CUDA build):
torch's own CUDA tensors, torch.cuda.current_stream() and graph capture.

The driver library is chosen once per process, at the first CUDA call, so
ATTNRES_CUDA_DRIVER is set when this module is imported (unless the
environment names a driver already)."""

import ctypes
import os

import numpy as np
import pytest

import attnres
import handmade_dlpack
from conftest import REPO, rel_err

SIM = os.environ.get("ATTNRES_CUDASIM_LIB", os.path.join(REPO, "build", "lib", "libattnres-cudasim.so"))
if os.path.exists(SIM):
    os.environ.setdefault("ATTNRES_CUDA_DRIVER", SIM)

D, N, T = 64, 3, 5


class Driver:
    """The few Driver API calls a test needs, on the simulated driver."""

    def __init__(self, path):
        lib = self.lib = ctypes.CDLL(path)
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
        self.check(lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
        self.check(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        self.buffers = []

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed with CUresult {rc}")

    def upload(self, array):
        array = np.ascontiguousarray(array, dtype=np.float32)
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), max(array.nbytes, 1)), "cuMemAlloc")
        self.buffers.append(ptr.value)
        self.check(self.lib.cuMemcpyHtoD_v2(ptr.value, array.ctypes.data, array.nbytes), "cuMemcpyHtoD")
        return handmade_dlpack.Exported(ptr.value, array.shape, device=(handmade_dlpack.DL_CUDA, 0))

    def download(self, exported):
        host = np.empty(exported.shape, np.float32)
        self.check(self.lib.cuMemcpyDtoH_v2(host.ctypes.data, exported.tensor.dl_tensor.data, host.nbytes),
                   "cuMemcpyDtoH")
        return host

    def stream(self):
        s = ctypes.c_void_p()
        self.check(self.lib.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
        return s.value

    def synchronize(self, stream):
        self.check(self.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def close(self):
        for p in self.buffers:
            self.lib.cuMemFree_v2(p)


@pytest.fixture(scope="module")
def cuda():
    if os.environ.get("ATTNRES_CUDA_DRIVER") != SIM or not os.path.exists(SIM):
        pytest.skip(f"the simulated CUDA driver is not built ({SIM}), or another driver is named")
    if attnres.device_count("cuda") < 1:
        pytest.skip("the simulated CUDA driver offers no device")
    with attnres.open_device("cuda:0") as dev:
        try:
            attnres.Plan(dev, None, d=D, n=N).close()
        except attnres.Error as e:
            # torch, when imported first, brings its own NVRTC into the
            # process, and that one may emit a PTX ISA newer than the
            # simulator reads.
            if "PTX ISA version" in str(e):
                pytest.skip(f"the NVRTC loaded in this process emits PTX the simulator does not read: {e}")
            if "NVRTC not found" in str(e):
                pytest.skip(f"no NVRTC to compile the CUDA kernels with: {e}")
            raise
        drv = Driver(SIM)
        yield dev, drv
        drv.close()


@pytest.fixture
def problem(rng):
    return rng.standard_normal((N, T, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32)


def cpu_mix(src, q, **kw):
    with attnres.open_device("cpu") as dev, attnres.Plan(dev, None, d=D, n=N, **kw) as plan:
        return plan.mix(src, q)


def test_the_device_is_the_simulator(cuda):
    dev, _ = cuda
    assert dev.info["simulated"] and dev.info["backend"] == "cuda"


def test_mix_runs_on_the_stream_given_as_an_int(cuda, problem):
    dev, drv = cuda
    src, q = problem
    plan = attnres.Plan(dev, None, d=D, n=N, heads=2)
    s = drv.stream()
    sources = [drv.upload(src[i]) for i in range(N)]
    query, out = drv.upload(q), drv.upload(np.full((T, D), np.nan, np.float32))
    assert plan.mix(sources, query, out=out, stream=s) is out
    drv.synchronize(s)
    assert rel_err(drv.download(out), cpu_mix(src, q, heads=2)) <= 1e-5
    # Every producer was asked for a capsule usable on that stream.
    for producer in sources + [query, out]:
        assert producer.calls == [{"stream": s, "max_version": (1, 0)}]


def test_a_stream_object_with_cuda_stream_is_used(cuda, problem):
    # torch.cuda.Stream (and ExternalStream) carry the CUstream as .cuda_stream.
    dev, drv = cuda
    src, q = problem

    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

    plan = attnres.Plan(dev, None, d=D, n=N)
    s = drv.stream()
    bank, query, out = drv.upload(src), drv.upload(q), drv.upload(np.zeros((T, D), np.float32))
    plan.mix(bank, query, out=out, stream=Stream(s))
    drv.synchronize(s)
    assert bank.calls == [{"stream": s, "max_version": (1, 0)}]
    assert rel_err(drv.download(out), cpu_mix(src, q)) <= 1e-5


def test_without_stream_the_default_stream_is_named_to_producers(cuda, problem):
    # The inputs are neither torch nor CuPy: the call runs on stream 0, which
    # DLPack spells 1 (the legacy default stream; 0 is reserved).
    dev, drv = cuda
    src, q = problem
    plan = attnres.Plan(dev, None, d=D, n=N)
    bank, query, out = drv.upload(src), drv.upload(q), drv.upload(np.zeros((T, D), np.float32))
    plan.mix(bank, query, out=out)
    drv.synchronize(None)
    assert query.calls == [{"stream": 1, "max_version": (1, 0)}]
    assert rel_err(drv.download(out), cpu_mix(src, q)) <= 1e-5


def test_phase1_and_phase2_on_a_stream(cuda, rng):
    dev, drv = cuda
    src = rng.standard_normal((N, T, D)).astype(np.float32)
    qs = rng.standard_normal((2, D)).astype(np.float32)
    b = rng.standard_normal((T, D)).astype(np.float32)
    s = drv.stream()
    p1 = attnres.Plan(dev, None, op="phase1", d=D, n=N, sites=2)
    p2 = attnres.Plan(dev, None, op="phase2", d=D)
    o1, lse = drv.upload(np.zeros((2, T, D), np.float32)), drv.upload(np.zeros((2, T, 1), np.float32))
    p1.phase1(drv.upload(src), drv.upload(qs), out=o1, lse=lse, stream=s)
    drv.synchronize(s)
    with attnres.open_device("cpu") as cpu:
        want_o1, want_lse = attnres.Plan(cpu, None, op="phase1", d=D, n=N, sites=2).phase1(src, qs)
        want = attnres.Plan(cpu, None, op="phase2", d=D).phase2(want_o1[0], want_lse[0], b, qs[0])
    assert rel_err(drv.download(o1), want_o1) <= 1e-5 and rel_err(drv.download(lse), want_lse) <= 1e-5
    o1_0 = drv.upload(drv.download(o1)[0])
    lse_0 = drv.upload(drv.download(lse)[0])
    out = drv.upload(np.zeros((T, D), np.float32))
    p2.phase2(o1_0, lse_0, drv.upload(b), drv.upload(qs[0]), out=out, stream=s)
    drv.synchronize(s)
    assert rel_err(drv.download(out), want) <= 1e-5


def test_host_arrays_on_a_cuda_plan_are_named(cuda, problem):
    dev, drv = cuda
    plan = attnres.Plan(dev, None, d=D, n=N)
    # NumPy refuses a stream for host memory; the error says where the array is.
    with pytest.raises(ValueError, match="sources is on cpu:0 but the plan runs on cuda:0"):
        plan.mix(*problem)
    with pytest.raises(ValueError, match=r"query is on cpu:0 but the plan runs on cuda:0"):
        plan.mix(drv.upload(problem[0]), handmade_dlpack.from_numpy(problem[1]))


def test_outputs_of_other_libraries_must_be_given_on_cuda(cuda, problem):
    dev, drv = cuda
    plan = attnres.Plan(dev, None, d=D, n=N)
    with pytest.raises(ValueError, match="no output library for these inputs on a CUDA plan: pass out="):
        plan.mix(drv.upload(problem[0]), drv.upload(problem[1]))


def test_bad_streams_are_refused(cuda, problem):
    dev, drv = cuda
    plan = attnres.Plan(dev, None, d=D, n=N)
    for bad in ("stream", True, 1.5):
        with pytest.raises(ValueError, match="stream= must be a CUstream as an int, or a torch or CuPy stream"):
            plan.mix(drv.upload(problem[0]), drv.upload(problem[1]), out=drv.upload(problem[0][0]), stream=bad)


def test_torch_cpu_tensors_on_a_cuda_plan_are_named_not_asked_for_a_cuda_stream(cuda):
    # attnres._stream asks torch for its current stream only for CUDA
    # tensors, so CPU tensors reach the device check.
    torch = pytest.importorskip("torch", reason="torch is not installed: its CPU tensors on a CUDA plan not tested")
    dev, _ = cuda
    plan = attnres.Plan(dev, None, d=D, n=N)
    with pytest.raises(ValueError, match="sources\\[0\\] is on cpu:0 but the plan runs on cuda:0"):
        plan.mix([torch.ones(T, D) for _ in range(N)], torch.ones(D))


@pytest.mark.parametrize("form,epilogue", [("replace", False), ("additive", False), ("additive", True)])
def test_mix_backward_on_a_stream_matches_the_cpu(cuda, rng, form, epilogue):
    """The mix backward on the simulated cuda:0, on a stream, into device
    gradients and a device workspace, against the CPU plan's gradients."""
    dev, drv = cuda
    additive = form == "additive"
    src = rng.standard_normal((N, T, D)).astype(np.float32)
    u = rng.standard_normal(D).astype(np.float32)
    dout = rng.standard_normal((T, D)).astype(np.float32)
    out, og = rng.standard_normal((T, D)).astype(np.float32), (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    dnormed = rng.standard_normal((T, D)).astype(np.float32)
    kw = dict(heads=2, form=form, epilogue=epilogue)
    with attnres.open_device("cpu") as cpu, attnres.Plan(cpu, None, op="mix_backward", d=D, n=N, **kw) as host:
        want = host.mix_backward(src, u, dout, alpha=0.5, **(dict(out=out, out_gain=og, dnormed=dnormed)
                                                             if epilogue else {}))
    plan = attnres.Plan(dev, None, op="mix_backward", d=D, n=N, **kw)
    nan = np.float32("nan")
    grads = {"dsources": drv.upload(np.full((N, T, D), nan)), "dquery": drv.upload(np.full(D, nan))}
    if additive:
        grads.update(dpartial=drv.upload(np.full((T, D), nan)), dalpha=drv.upload(np.full(1, nan)))
    extra = {}
    if epilogue:
        grads["dout_gain"] = drv.upload(np.full(D, nan))
        extra = dict(out=drv.upload(out), out_gain=drv.upload(og), dnormed=drv.upload(dnormed))
    workspace = drv.upload(np.zeros(plan.mix_backward_workspace_size(T) // 4 + 16, np.float32))
    with pytest.raises(ValueError, match="needs workspace="):
        plan.mix_backward([drv.upload(src[i]) for i in range(N)], drv.upload(u), drv.upload(dout), **grads, **extra)
    with pytest.raises(ValueError, match="gain= and dgain= are for CPU plans"):
        plan.mix_backward([drv.upload(src[i]) for i in range(N)], drv.upload(u), drv.upload(dout),
                          gain=drv.upload(og), workspace=workspace, **grads, **extra)
    s = drv.stream()
    got = plan.mix_backward([drv.upload(src[i]) for i in range(N)], drv.upload(u), drv.upload(dout), alpha=0.5,
                            stream=s, workspace=workspace, **grads, **extra)
    drv.synchronize(s)
    assert got[0] is grads["dsources"] and got[1] is grads["dquery"] and got[2] is None
    names = ["dsources", "dquery"] + (["dpartial", "dalpha"] if additive else []) + (["dout_gain"] if epilogue else [])
    wanted = [want[0], want[1]] + ([want[3], want[4]] if additive else []) + ([want[-1]] if epilogue else [])
    for name, w in zip(names, wanted):
        assert rel_err(drv.download(grads[name]), w) <= 1e-5, name


@pytest.mark.parametrize("heads", [1, 2])
def test_phase1_backward_on_a_stream_matches_the_cpu(cuda, rng, heads):
    """Phase 1's backward on the simulated cuda:0, on a stream, into device
    gradients and a device workspace, against the CPU plan's gradients; one
    site's dlse given, the other's absent (zero)."""
    dev, drv = cuda
    sites = 2
    src = rng.standard_normal((N, T, D)).astype(np.float32)
    qs = rng.standard_normal((sites, D)).astype(np.float32)
    do1 = rng.standard_normal((sites, T, D)).astype(np.float32)
    dlse = rng.standard_normal((sites, T, heads)).astype(np.float32)
    kw = dict(op="phase1_backward", d=D, n=N, heads=heads, sites=sites)
    with attnres.open_device("cpu") as cpu, attnres.Plan(cpu, None, **kw) as host:
        want = host.phase1_backward(src, qs, do1, dlse)
    plan = attnres.Plan(dev, None, **kw)
    nan = np.float32("nan")
    grads = {"dsources": drv.upload(np.full((N, T, D), nan)), "dqueries": drv.upload(np.full((sites, D), nan))}
    workspace = drv.upload(np.zeros(plan.workspace_size(T) // 4 + 16, np.float32))
    s = drv.stream()
    got = plan.phase1_backward(drv.upload(src), drv.upload(qs), drv.upload(do1), drv.upload(dlse), stream=s,
                               workspace=workspace, **grads)
    drv.synchronize(s)
    assert got[0] is grads["dsources"] and got[1] is grads["dqueries"]
    for name, w in zip(["dsources", "dqueries"], want):
        assert rel_err(drv.download(grads[name]), w) <= 1e-5, name


@pytest.mark.parametrize("fuse_add,epilogue", [(False, False), (True, True)])
def test_phase2_backward_on_a_stream_matches_the_cpu(cuda, rng, fuse_add, epilogue):
    """Phase 2's backward on the simulated cuda:0, on a stream, against the
    CPU plan's gradients: with the fused add's dsublayer and the epilogue's
    d(out_gain), and without."""
    dev, drv = cuda
    heads = 2
    o1, b, dout = (rng.standard_normal((T, D)).astype(np.float32) for _ in range(3))
    lse = rng.standard_normal((T, heads)).astype(np.float32)
    u = rng.standard_normal(D).astype(np.float32)
    og, dnormed = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32), rng.standard_normal((T, D)).astype(np.float32)
    kw = dict(op="phase2_backward", d=D, heads=heads, fuse_add=fuse_add, epilogue=epilogue)
    epi = dict(out_gain=og, dnormed=dnormed) if epilogue else {}
    with attnres.open_device("cpu") as cpu, attnres.Plan(cpu, None, **kw) as host:
        want = host.phase2_backward(o1, lse, b, u, dout, **epi)
    plan = attnres.Plan(dev, None, **kw)
    nan = np.float32("nan")
    names = ["do1", "dlse", "dpartial"] + (["dsublayer"] if fuse_add else []) + ["dquery"] + \
        (["dout_gain"] if epilogue else [])
    shapes = {"dlse": (T, heads), "dquery": (D,), "dout_gain": (D,)}
    grads = {name: drv.upload(np.full(shapes.get(name, (T, D)), nan)) for name in names}
    extra = {k: drv.upload(v) for k, v in epi.items()}
    workspace = drv.upload(np.zeros(plan.workspace_size(T) // 4 + 16, np.float32))
    s = drv.stream()
    plan.phase2_backward(drv.upload(o1), drv.upload(lse), drv.upload(b), drv.upload(u), drv.upload(dout),
                         stream=s, workspace=workspace, **grads, **extra)
    drv.synchronize(s)
    # The CPU returns (do1, dlse, dpartial, dquery, dgain[, dout_gain]);
    # dsublayer holds dpartial's values.
    wanted = dict(zip(["do1", "dlse", "dpartial", "dquery", "dgain"], want), dsublayer=want[2])
    if epilogue:
        wanted["dout_gain"] = want[5]
    for name in names:
        assert rel_err(drv.download(grads[name]), wanted[name]) <= 1e-5, name
