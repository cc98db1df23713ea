"""An independent fp64 implementation of DESIGN.md section 1 in plain Python,
written separately from the library's C reference, as the tests' oracle."""

import math
import struct


def mix(sources, query, gain=None, heads=1, eps=1e-6, scale=1.0, partial=None, alpha=1.0,
        out_gain=None, out_eps=1e-6):
    """sources: N lists of T rows of d floats. Returns (out, normed) as T rows."""
    n = len(sources)
    t_count = len(sources[0])
    d = len(query)
    hd = d // heads
    u = [query[k] * (gain[k] if gain is not None else 1.0) for k in range(d)]
    out, normed = [], []
    for t in range(t_count):
        rows = [sources[i][t] for i in range(n)]
        r = [1.0 / math.sqrt(sum(x * x for x in row) / d + eps) for row in rows]
        o = [0.0] * d
        for h in range(heads):
            ks = range(h * hd, (h + 1) * hd)
            scores = [scale * sum(r[i] * rows[i][k] * u[k] for k in ks) for i in range(n)]
            finite = [s for s in scores if not math.isnan(s)]
            m = max(finite) if finite else 0.0
            if any(math.isnan(s) for s in scores):
                weights = [math.nan] * n
            else:
                e = [math.exp(s - m) for s in scores]
                total = sum(e)
                weights = [x / total for x in e]
            for k in ks:
                o[k] = sum(weights[i] * rows[i][k] for i in range(n))
        if partial is not None:
            o = [partial[t][k] + alpha * o[k] for k in range(d)]
        out.append(o)
        if out_gain is not None:
            rs = 1.0 / math.sqrt(sum(x * x for x in o) / d + out_eps)
            normed.append([o[k] * rs * out_gain[k] for k in range(d)])
    return out, normed


def round_bf16(x):
    """Rounds a float to bfloat16 (nearest even), returned as a float."""
    (w,) = struct.unpack("<I", struct.pack("<f", x))
    w = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", w & 0xFFFFFFFF))[0]


def round_f16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def round_f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


ROUND = {"f32": round_f32, "bf16": round_bf16, "f16": round_f16}
