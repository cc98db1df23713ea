-- lib/c_rowops.lua: C text for the per-row reductions that the CPU
-- templates share (cpu/mix.lua, cpu/phase1.lua, cpu/phase2.lua). They expect lib/c_storage.lua's helpers (storage_t, vf,
-- load_row, load_f32, hsum) to be emitted first. Every loop steps by
-- vec * unroll lanes, so the head width must be a multiple of that.

local M = {}

-- Emits `fmt` for the unrolled accumulators 0..u-1 (each %d is the index),
-- one line each.
local function per_lane(u, fmt)
  return gen.each(u, function(i)
    local j = i - 1
    return (fmt:gsub("%%d", tostring(j)))
  end, "\n")
end

-- "prefix0 + prefix1 + ...": the sum of the unrolled accumulators.
local function sum_lanes(u, prefix)
  return gen.each(u, function(i) return prefix .. (i - 1) end, " + ")
end

M.per_lane = per_lane
M.sum_lanes = sum_lanes

-- row_stats(row, query, hd, heads, dot): the sum of squares over the whole
-- row (shared by all heads), and per head the dot product of the row with
-- one query, in one sweep over the row.
function M.row_stats(p)
  local u = p.unroll
  return gen.subst([[
/* Sum of squares over the whole row and, per head, its dot product with
 * `query`, in one sweep: the row is read from memory once. */
static inline float row_stats(const storage_t *row, const float *query,
                              int64_t hd, int heads, float *dot)
{
    float sumsq = 0.0f;
    for (int h = 0; h < heads; h++) {
${zero}
        for (int64_t k = (int64_t)h * hd; k < (int64_t)(h + 1) * hd; k += ${STEP}) {
${body}
        }
        sumsq += hsum(${ss});
        dot[h] = hsum(${dp});
    }
    return sumsq;
}
]], {
    STEP = p.vec * u,
    zero = per_lane(u, "        vf ss%d = {0}, dp%d = {0};"),
    body = gen.each(u, function(i)
      local j = i - 1
      return string.format(
        "            const vf x%d = load_row(row + k + %d);\n" ..
        "            ss%d += x%d * x%d;\n" ..
        "            dp%d += x%d * load_f32(query + k + %d);", j, j * p.vec, j, j, j, j, j, j * p.vec)
    end, "\n"),
    ss = sum_lanes(u, "ss"),
    dp = sum_lanes(u, "dp"),
  })
end

-- head_dot(row, query, k0, hd): one head's dot product of a row (already in
-- cache) with another query.
function M.head_dot(p)
  local u = p.unroll
  return gen.subst([[
/* Dot product of row[k0, k0 + hd) with query[k0, k0 + hd). */
static inline float head_dot(const storage_t *row, const float *query,
                             int64_t k0, int64_t hd)
{
${zero}
    for (int64_t k = k0; k < k0 + hd; k += ${STEP}) {
${body}
    }
    return hsum(${dp});
}
]], {
    STEP = p.vec * u,
    zero = per_lane(u, "    vf dp%d = {0};"),
    body = gen.each(u, function(i)
      local j = i - 1
      return string.format("        dp%d += load_row(row + k + %d) * load_f32(query + k + %d);",
                           j, j * p.vec, j * p.vec)
    end, "\n"),
    dp = sum_lanes(u, "dp"),
  })
end

-- depth_softmax(vec): the C text of depth_softmax(score, weight, n, heads):
-- per head, the softmax over the n sources of score[i * heads + h] into
-- weight[i * heads + h] (the two may be the same array). The exponentials
-- run over all n * heads scores in vectors of `vec` lanes: a multi-head
-- mix has n * heads of them per token (72 for N = 9, H = 8), and one expf
-- call each was a visible share of its work (the MHAR kernel from L2 went
-- from 26.6 to 28.1 GB/s on the Zen 4 guest, docs/cpu_kernels.md).
function M.depth_softmax(vec)
  return gen.subst([[
/* e^x lane by lane for x <= 0 (the scores less their maximum): x is
 * clamped to -86 (e^-86 ~ 4e-38 stays a normal number), k = round(x / ln 2)
 * by adding 1.5 * 2^23, r = x - k ln 2 in two parts (the first product is
 * exact), e^r by its Taylor series to r^7 (|r| <= ln 2 / 2: below 2^-27),
 * and 2^k added into the exponent. A NaN lane stays NaN. */
static inline vf exp_nonpositive(vf x)
{
    const vf low = (vf){0} - 86.0f, round = (vf){0} + 12582912.0f;
    const vi below = x < low;
    x = (vf)(((vi)low & below) | ((vi)x & ~below));
    const vf t = x * 1.44269504f + round;
    const vf k = t - round;
    const vf r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
    vf e = (vf){0} + 1.0f / 5040.0f;
    e = e * r + 1.0f / 720.0f;
    e = e * r + 1.0f / 120.0f;
    e = e * r + 1.0f / 24.0f;
    e = e * r + 1.0f / 6.0f;
    e = e * r + 0.5f;
    e = e * r + 1.0f;
    e = e * r + 1.0f;
    return (vf)((vi)e + (((vi)t - (vi)round) << 23));
}

/* Softmax over depth, one per head: weights become probabilities. */
static inline void depth_softmax(const float *score, float *weight, int n, int heads)
{
    const int count = n * heads;
    float m[heads], inv[heads];
    for (int h = 0; h < heads; h++)
        m[h] = -1e30f;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++)
            m[h] = fmaxf(m[h], score[i * heads + h]);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++)
            weight[i * heads + h] = score[i * heads + h] - m[h];
    int j = 0;
    for (; j + ${VEC} <= count; j += ${VEC})
        store_f32(weight + j, exp_nonpositive(load_f32(weight + j)));
    if (j < count) {
        float tail[${VEC}] = {0};
        memcpy(tail, weight + j, (size_t)(count - j) * sizeof *tail);
        store_f32(tail, exp_nonpositive(load_f32(tail)));
        memcpy(weight + j, tail, (size_t)(count - j) * sizeof *tail);
    }
    for (int h = 0; h < heads; h++)
        inv[h] = 0.0f;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++)
            inv[h] += weight[i * heads + h];
    for (int h = 0; h < heads; h++)
        inv[h] = 1.0f / inv[h];
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++)
            weight[i * heads + h] *= inv[h];
}
]], { VEC = vec })
end

-- sigmoid(x) in fp32 without overflow for large |x|; NaN stays NaN.
M.sigmoid = [[
/* The logistic function; exp never overflows, and NaN stays NaN. */
static inline float sigmoid(float x)
{
    if (x >= 0.0f)
        return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
}
]]

return M
