"""An independent fp64 implementation of DESIGN.md section 1 (and section 1b,
the backwards of the mix and of the two phases) in plain Python, written
separately from the library's C reference, as the tests' oracle."""

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


def _fold(query, gain):
    return [query[k] * (gain[k] if gain is not None else 1.0) for k in range(len(query))]


def _inv_rms(row, eps):
    return 1.0 / math.sqrt(sum(x * x for x in row) / len(row) + eps)


def phase1(sources, queries, gains=None, heads=1, eps=1e-6, scale=1.0):
    """Block AttnRes phase 1. sources: n lists of T rows of d floats; queries
    (and gains): S rows of d floats. Returns (o1, lse): o1 is S lists of T
    rows of d floats, lse is S lists of T rows of H floats (m + log l)."""
    n = len(sources)
    t_count = len(sources[0])
    d = len(queries[0])
    hd = d // heads
    o1, lse = [], []
    for j, query in enumerate(queries):
        u = _fold(query, gains[j] if gains is not None else None)
        o_site, l_site = [], []
        for t in range(t_count):
            rows = [sources[i][t] for i in range(n)]
            r = [_inv_rms(row, eps) for row in rows]
            o = [0.0] * d
            lse_t = []
            for h in range(heads):
                ks = range(h * hd, (h + 1) * hd)
                scores = [scale * sum(r[i] * rows[i][k] * u[k] for k in ks) for i in range(n)]
                if any(math.isnan(s) for s in scores):
                    weights, lse_h = [math.nan] * n, math.nan
                else:
                    m = max(scores)
                    e = [math.exp(s - m) for s in scores]
                    total = sum(e)
                    weights = [x / total for x in e]
                    lse_h = m + math.log(total)
                lse_t.append(lse_h)
                for k in ks:
                    o[k] = sum(weights[i] * rows[i][k] for i in range(n))
            o_site.append(o)
            l_site.append(lse_t)
        o1.append(o_site)
        lse.append(l_site)
    return o1, lse


def _sigmoid(x):
    if math.isnan(x):
        return math.nan
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def phase2(o1, lse, partial, query, gain=None, heads=1, eps=1e-6, scale=1.0, sublayer=None, out_gain=None,
           out_eps=1e-6):
    """Block AttnRes phase 2 for one site. o1, partial, sublayer: T rows of d
    floats; lse: T rows of H floats. Returns (out, normed, partial_new), where
    partial_new is partial + sublayer (or partial when sublayer is None)."""
    d = len(query)
    hd = d // heads
    u = _fold(query, gain)
    out, normed, partial_new = [], [], []
    for t in range(len(o1)):
        b = list(partial[t])
        if sublayer is not None:
            b = [b[k] + sublayer[t][k] for k in range(d)]
        partial_new.append(b)
        r = _inv_rms(b, eps)
        o = [0.0] * d
        for h in range(heads):
            ks = range(h * hd, (h + 1) * hd)
            s2 = scale * sum(r * b[k] * u[k] for k in ks)
            p2 = _sigmoid(s2 - lse[t][h])
            for k in ks:
                o[k] = o1[t][k] + p2 * (b[k] - o1[t][k])
        out.append(o)
        if out_gain is not None:
            rs = _inv_rms(o, out_eps)
            normed.append([o[k] * rs * out_gain[k] for k in range(d)])
    return out, normed, partial_new


def rmsnorm_backward(out, dnormed, out_gain, out_eps=1e-6, dout=None):
    """The output-norm epilogue's backward, normed = out * rr * out_gain with
    rr = 1 / sqrt(mean(out^2) + out_eps), per token. out, dnormed (and dout,
    the gradient that reaches out directly; None is zeros): T rows of d
    floats. Returns (the whole gradient of out, T rows; that of out_gain, d
    floats summed over tokens)."""
    d = len(out_gain)
    grad, dgain = [], [0.0] * d
    for t, o in enumerate(out):
        dn = dnormed[t]
        rr = _inv_rms(o, out_eps)
        # d(normed_k)/d(o_j) = g_k (rr [k = j] - o_k o_j rr^3 / d)
        dot = sum(dn[k] * out_gain[k] * o[k] for k in range(d))
        base = dout[t] if dout is not None else [0.0] * d
        grad.append([base[k] + rr * dn[k] * out_gain[k] - o[k] * rr ** 3 * dot / d for k in range(d)])
        for k in range(d):
            dgain[k] += rr * dn[k] * o[k]
    return grad, dgain


def mix_backward(sources, query, dout, gain=None, heads=1, eps=1e-6, scale=1.0, partial=None, alpha=1.0,
                 out=None, out_gain=None, dnormed=None, out_eps=1e-6):
    """The backward of mix (DESIGN.md section 1b).
    sources: N lists of T rows of d floats; dout: T rows of d floats, the
    gradient of out. partial only selects the additive form: its values do
    not enter the gradients. Returns a dict with dsources (N lists of T rows),
    dquery and dgain (d floats each, the gradients of query and gain through
    u = gain * query, summed over tokens), and in the additive form dpartial
    (T rows) and dalpha (a float); the others are None.

    With out_gain, the output-norm epilogue: out is the forward's out (T
    rows, as the backward is given it, not recomputed), dnormed the gradient
    of normed, and dout (None: zeros) the part of out's gradient that does not
    pass through normed; the dict's dout_gain holds the gradient of out_gain
    (d floats, summed over tokens), else None."""
    n = len(sources)
    t_count = len(sources[0])
    d = len(query)
    hd = d // heads
    u = _fold(query, gain)
    additive = partial is not None
    dout_gain = None
    if out_gain is not None:
        dout, dout_gain = rmsnorm_backward(out, dnormed, out_gain, out_eps, dout)
    dsources = [[None] * t_count for _ in range(n)]
    du = [0.0] * d
    dpartial = [] if additive else None
    dalpha = 0.0
    for t in range(t_count):
        rows = [sources[i][t] for i in range(n)]
        g_out = dout[t]
        # Step 2: the gradient of the mix, and those of partial and alpha.
        gm = [alpha * x for x in g_out] if additive else list(g_out)
        r = [_inv_rms(row, eps) for row in rows]
        weights = [[0.0] * heads for _ in range(n)]
        dz = [[0.0] * heads for _ in range(n)]
        q = [[0.0] * heads for _ in range(n)]
        mix_row = [0.0] * d
        for h in range(heads):
            ks = range(h * hd, (h + 1) * hd)
            for i in range(n):
                q[i][h] = sum(rows[i][k] * u[k] for k in ks)
            scores = [scale * r[i] * q[i][h] for i in range(n)]
            m = max(scores)
            e = [math.exp(sc - m) for sc in scores]
            total = sum(e)
            a = [x / total for x in e]
            for k in ks:
                mix_row[k] = sum(a[i] * rows[i][k] for i in range(n))
            # Step 3: the softmax's backward; p is the gradient of the weights.
            p = [sum(gm[k] * rows[i][k] for k in ks) for i in range(n)]
            delta = sum(a[i] * p[i] for i in range(n))
            for i in range(n):
                weights[i][h] = a[i]
                dz[i][h] = a[i] * (p[i] - delta)
        if additive:
            dpartial.append(list(g_out))
            dalpha += sum(g_out[k] * mix_row[k] for k in range(d))
        # Step 4: the value path and the score path, which reaches every
        # element of a row through r.
        for i in range(n):
            c = sum(dz[i][h] * q[i][h] for h in range(heads))
            dv = [0.0] * d
            for k in range(d):
                h = k // hd
                dv[k] = weights[i][h] * gm[k] + scale * r[i] * (dz[i][h] * u[k] - rows[i][k] * r[i] ** 2 * c / d)
                du[k] += scale * dz[i][h] * r[i] * rows[i][k]
            dsources[i][t] = dv
    dquery = [du[k] * (gain[k] if gain is not None else 1.0) for k in range(d)]
    dgain = [du[k] * query[k] for k in range(d)] if gain is not None else None
    return {"dsources": dsources, "dquery": dquery, "dgain": dgain, "dpartial": dpartial,
            "dalpha": dalpha if additive else None, "dout_gain": dout_gain}


def _score_backward(v, u, r, dz, q, scale, heads, dv, du):
    """Adds the gradient that reaches a row v and the folded query u through
    the scores s_h = scale * r * <v, u>_h, given dz_h = dL/ds_h: through u
    directly, and through r = (mean(v^2) + eps)^-1/2, whose derivative is
    -r^3 v / d, so that every head's score reaches the whole row."""
    d = len(v)
    hd = d // heads
    c = sum(dz[h] * q[h] for h in range(heads))
    for k in range(d):
        z = dz[k // hd]
        dv[k] += scale * r * (z * u[k] - v[k] * r * r * c / d)
        du[k] += scale * z * r * v[k]


def phase1_backward(sources, queries, do1, dlse=None, gains=None, heads=1, eps=1e-6, scale=1.0):
    """The backward of phase1 (DESIGN.md section 1b). sources: n lists of T
    rows of d floats; queries (and gains): S rows of d floats; do1: S lists of
    T rows of d floats, the gradient of each site's o1; dlse: S lists of T
    rows of H floats, that of its lse (None: zeros). Returns a dict with
    dsources (n lists of T rows, each the sum over the S sites), dqueries and
    dgains (S rows of d floats, the gradients of queries and gains through
    u = gain * query, summed over tokens; dgains None without gains)."""
    n = len(sources)
    t_count = len(sources[0])
    s_count = len(queries)
    d = len(queries[0])
    hd = d // heads
    us = [_fold(queries[j], gains[j] if gains is not None else None) for j in range(s_count)]
    dsources = [[None] * t_count for _ in range(n)]
    du = [[0.0] * d for _ in range(s_count)]
    for t in range(t_count):
        rows = [sources[i][t] for i in range(n)]
        r = [_inv_rms(row, eps) for row in rows]
        dv = [[0.0] * d for _ in range(n)]
        for j in range(s_count):
            u, gm = us[j], do1[j][t]
            dl = dlse[j][t] if dlse is not None else [0.0] * heads
            q = [[sum(rows[i][k] * u[k] for k in range(h * hd, (h + 1) * hd)) for h in range(heads)]
                 for i in range(n)]
            a = [[0.0] * heads for _ in range(n)]
            dz = [[0.0] * heads for _ in range(n)]
            for h in range(heads):
                ks = range(h * hd, (h + 1) * hd)
                scores = [scale * r[i] * q[i][h] for i in range(n)]
                m = max(scores)
                e = [math.exp(sc - m) for sc in scores]
                total = sum(e)
                for i in range(n):
                    a[i][h] = e[i] / total
                # The softmax's backward, with the log-sum-exp's gradient:
                # d lse / d s_i = a_i, so dz_i = a_i (dl + p_i - delta).
                p = [sum(gm[k] * rows[i][k] for k in ks) for i in range(n)]
                delta = sum(a[i][h] * p[i] for i in range(n))
                for i in range(n):
                    dz[i][h] = a[i][h] * (dl[h] + p[i] - delta)
            for i in range(n):
                for k in range(d):
                    dv[i][k] += a[i][k // hd] * gm[k]
                _score_backward(rows[i], u, r[i], dz[i], q[i], scale, heads, dv[i], du[j])
        for i in range(n):
            dsources[i][t] = dv[i]
    dqueries = [[du[j][k] * (gains[j][k] if gains is not None else 1.0) for k in range(d)] for j in range(s_count)]
    dgains = [[du[j][k] * queries[j][k] for k in range(d)] for j in range(s_count)] if gains is not None else None
    return {"dsources": dsources, "dqueries": dqueries, "dgains": dgains}


def phase2_backward(o1, lse, b, query, dout, gain=None, heads=1, eps=1e-6, scale=1.0, out_gain=None,
                    dnormed=None, out_eps=1e-6, fuse_add=False):
    """The backward of phase2 for one site (DESIGN.md section 1b). o1, b: T
    rows of d floats, b the partial sum as the forward used it (with the
    fused add, partial + sublayer); lse: T rows of H floats; dout: T rows of
    d floats, the gradient of out (None: zeros, with the epilogue). With
    out_gain the output-norm epilogue: out is recomputed from o1 and b, and
    dnormed is the gradient of normed. Returns a dict with do1 and db (T
    rows), dlse (T rows of H), dsublayer (fuse_add: the same values as db,
    else None), dquery and dgain (d floats through u = gain * query, summed
    over tokens; dgain None without a gain) and dout_gain (d floats, the
    epilogue's, else None)."""
    t_count = len(o1)
    d = len(query)
    hd = d // heads
    u = _fold(query, gain)
    r, q, p2, out = [], [], [], []
    for t in range(t_count):
        bt, ot = b[t], o1[t]
        r.append(_inv_rms(bt, eps))
        q.append([sum(bt[k] * u[k] for k in range(h * hd, (h + 1) * hd)) for h in range(heads)])
        p2.append([_sigmoid(scale * r[t] * q[t][h] - lse[t][h]) for h in range(heads)])
        out.append([ot[k] + p2[t][k // hd] * (bt[k] - ot[k]) for k in range(d)])
    dout_gain = None
    g_all = dout if dout is not None else [[0.0] * d for _ in range(t_count)]
    if out_gain is not None:
        g_all, dout_gain = rmsnorm_backward(out, dnormed, out_gain, out_eps, dout)
    do1, dlse, db = [], [], []
    du = [0.0] * d
    for t in range(t_count):
        bt, ot, g = b[t], o1[t], g_all[t]
        # out = o1 + p2 (b - o1): o1 keeps 1 - p2 of the gradient, b gets p2
        # of it, and p2 = sigmoid(s2 - lse) passes <g, b - o1> on to s2 and,
        # negated, to lse.
        dx = []
        for h in range(heads):
            pi = sum(g[k] * (bt[k] - ot[k]) for k in range(h * hd, (h + 1) * hd))
            dx.append(p2[t][h] * (1.0 - p2[t][h]) * pi)
        dlse.append([-x for x in dx])
        do1.append([g[k] * (1.0 - p2[t][k // hd]) for k in range(d)])
        dbt = [g[k] * p2[t][k // hd] for k in range(d)]
        _score_backward(bt, u, r[t], dx, q[t], scale, heads, dbt, du)
        db.append(dbt)
    return {"do1": do1, "dlse": dlse, "db": db, "dsublayer": [list(x) for x in db] if fuse_add else None,
            "dquery": [du[k] * (gain[k] if gain is not None else 1.0) for k in range(d)],
            "dgain": [du[k] * query[k] for k in range(d)] if gain is not None else None, "dout_gain": dout_gain}


def worst(errors):
    """The largest of the errors, or NaN if any is NaN: max() keeps whichever
    argument it met first when the other is a NaN, so a NaN in an output
    compared after the first would pass unseen."""
    errors = list(errors)
    return math.nan if any(math.isnan(e) for e in errors) else max(errors)
