-- lib/c_rowops.lua: C text for the per-row reductions that the CPU
-- templates share (cpu/mix.lua, cpu/phase1.lua, cpu/phase2.lua). They expect lib/c_storage.lua's helpers (storage_t, vf,
-- load_row, load_f32, hsum) to be emitted first. Every loop steps by
-- vec * unroll lanes, so the head width must be a multiple of that.

local M = {}

-- Emits `fmt` for the unrolled accumulators 0..u-1 (each %d is the index).
local function per_lane(u, fmt)
  return gen.each(u, function(i)
    local j = i - 1
    return (fmt:gsub("%%d", tostring(j)))
  end, "\n")
end

local function sum_lanes(u, prefix)
  return gen.each(u, function(i) return prefix .. (i - 1) end, " + ")
end

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

-- depth_softmax(score, weight, n, heads): per head, the softmax over the n
-- sources of score[i * heads + h] into weight[i * heads + h] (the two may be
-- the same array).
M.depth_softmax = [[
/* Softmax over depth, one per head: weights become probabilities. */
static inline void depth_softmax(const float *score, float *weight, int n, int heads)
{
    for (int h = 0; h < heads; h++) {
        float m = -1e30f, l = 0.0f;
        for (int i = 0; i < n; i++)
            m = fmaxf(m, score[i * heads + h]);
        for (int i = 0; i < n; i++) {
            const float e = expf(score[i * heads + h] - m);
            weight[i * heads + h] = e;
            l += e;
        }
        for (int i = 0; i < n; i++)
            weight[i * heads + h] /= l;
    }
}
]]

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
