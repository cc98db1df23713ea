"""Minimal .npy reading and writing for float32 arrays, standard library only,
so the CLI tests need nothing installed beyond Python itself."""

import ast
import struct


def write_f32(path, shape, values, descr="<f4", fortran=False, version=1):
    """Writes values (a flat list) with the given shape as a .npy file."""
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr,
        "True" if fortran else "False",
        "".join("%d, " % s for s in shape) if len(shape) != 1 else "%d," % shape[0],
    )
    prefix = 10 if version == 1 else 12
    pad = (64 - (prefix + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    fmt = (">" if descr.startswith(">") else "<") + "%d%s" % (len(values), "d" if descr.endswith("8") else "f")
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY" + bytes([version, 0]))
        f.write(struct.pack("<H" if version == 1 else "<I", len(header)))
        f.write(header.encode("latin1"))
        f.write(struct.pack(fmt, *values))


def read_f32(path):
    """Returns (shape, flat list of floats) of a little-endian float32 .npy."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", "bad magic"
    if data[6] == 1:
        (hlen,) = struct.unpack("<H", data[8:10])
        start = 10
    else:
        (hlen,) = struct.unpack("<I", data[8:12])
        start = 12
    header = ast.literal_eval(data[start : start + hlen].decode("latin1"))
    assert header["descr"] == "<f4" and not header["fortran_order"], header
    shape = tuple(header["shape"])
    count = 1
    for s in shape:
        count *= s
    body = data[start + hlen :]
    assert len(body) == 4 * count, "size mismatch"
    return shape, list(struct.unpack("<%df" % count, body))


# The small mix problem several CLI tests run: N sources of T tokens of
# width D, and a query.
N, T, D = 3, 4, 16


def write_small_mix(sources_path, query_path):
    """Writes the small problem's sources ([N, T, D], values in [-5/3, 5/3])
    and its query ([D])."""
    write_f32(sources_path, (N, T, D), small_mix_sources())
    write_f32(query_path, (D,), [0.1 * (k % 5) for k in range(D)])


def small_mix_sources():
    """The small problem's sources as a flat list, for a test to alter."""
    return [((i * 7) % 11 - 5) / 3.0 for i in range(N * T * D)]

