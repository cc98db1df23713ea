-- cpu/mix_fused.lua: the AttnRes depth mix (DESIGN §1) for the CPU, as one
-- register-blocked sweep per token that both mixes token t and gathers the
-- statistics of token t + 1.
--
-- Why: the mix is read-bound, so the cores must finish their arithmetic
-- well inside the time memory takes to deliver the rows. Per token, the
-- sweep reads token t's rows (already in L2, their scores known) and
-- accumulates the output, while it streams token t + 1's rows from memory
-- and accumulates their sums of squares and query dot products in
-- registers. Every row of the next token is read from memory exactly once
-- and from L2 once more; nothing is spilled to a scratch row.
--
-- Parameters:
--   vec     fp32 lanes per vector (8 = AVX2, 16 = AVX-512); each step of the
--           sweep handles 2 * vec elements as a pair of vectors, in the
--           order lib/c_storage.lua's pair helpers choose (for bf16 the
--           even and odd elements, widened by two integer operations).
--   group   the most next-token rows whose statistics one sweep gathers:
--           2 * group vector accumulators must fit in the registers. More
--           sources than that take further sweeps over the extra rows.
--   ahead   how many bytes ahead of the sweep, in every next-token row
--           (and the partial row), software prefetches ask for; 0 leaves
--           it to the hardware prefetchers. The sweep spends a dozen
--           instructions on each 64-byte line it reads from memory, so
--           the out-of-order window alone keeps too few lines in flight
--           to stream at the rate a read-only loop reaches.
--   threads the most worker threads the launch spreads tokens over.
-- The kernel entry processes tokens [t0, t1); the runtime splits T.

local storage = require("lib/c_storage")
local kabi = require("lib/kernel_abi")
local rowops = require("lib/c_rowops")
local space = require("lib/cpu_space")
local prefetch_lib = require("lib/c_prefetch")
local kernel = require("lib/c_kernel")

local T = {
  backend = "cpu",
  op = "mix",
  params = {
    { name = "dtype", values = { "f32", "bf16", "f16" } },
    { name = "vec", values = { 8, 16 } },
    { name = "group", values = { 4, 8 } },
    { name = "ahead", values = { 0, 2048 } },
    { name = "threads", values = { 1, 2, 4, 8, 16, 32, 64 } },
  },
  -- The runtime's built-in kernels per ISA level (compiled into the library
  -- with that level's flags, chosen at device open), spread over all cores;
  -- head widths that are not a multiple of the step take cpu/mix.lua's
  -- scalar generic kernel. No software prefetch: with the N sources back to
  -- back in one bank (rows 64 KiB-multiples apart, the same L1 sets), the
  -- prefetching form ran K3's T = 64 at 2.5-3.8x the plain one's time
  -- (bench/results/fallback-2026-12-01.md).
  builtin = {
    avx512 = { vec = 16, group = 8, ahead = 0, threads = 64 },
    avx2 = { vec = 8, group = 8, ahead = 0, threads = 64 },
    sse2 = { vec = 8, group = 4, ahead = 0, threads = 64 },
    neon = { vec = 8, group = 4, ahead = 0, threads = 64 },
  },
}

function T.id(p)
  return string.format("mix_c_%s_fused_v%d_g%d_a%d_t%d", p.dtype, p.vec, p.group, p.ahead,
                       p.threads)
end

function T.launch(p)
  return { abi = kabi.version("cpu_mix") }
end

-- One sweep step covers a pair of vectors.
function T.step(p)
  return 2 * p.vec
end

function T.applies(p, problem, device)
  return space.applies(T, p, problem, device)
end

-- Prefetches of every line of a sweep step, p.ahead bytes ahead of `ptr`;
-- "" when p.ahead is 0.
local function prefetch(p, ptr, indent)
  if p.ahead == 0 then return "" end
  return prefetch_lib.lines(ptr, 2 * p.vec * storage.size[p.dtype], p.ahead, indent)
end

-- The sweep, inlined once per group size so that its accumulators become
-- registers: `g` is a constant in every call the dispatcher makes.
local function sweep(p)
  return gen.subst([[
/* One pass over the row. With `cur`, mixes the current token's n rows
 * (weights known) into `out`; for the g rows in `rows`, gathers the sum of
 * squares (ss_out[j]) and, per head, the dot product with the pair-ordered
 * query (dp_out[j * heads + h]). */
static inline __attribute__((always_inline)) void sweep(
    const struct attnres_cpu_mix_args *a, const float *qp,
    const storage_t *const *cur, const float *weight, const storage_t *partial,
    storage_t *out, float *keep, vf *sq,
    int g, const storage_t *const *rows, float *ss_out, float *dp_out)
{
    const int64_t d = a->d, hd = d / a->heads;
    const int n = a->n, heads = a->heads;
    vf ss[${G}], dp[${G}];
#pragma GCC unroll ${G}
    for (int j = 0; j < g; j++)
        ss[j] = (vf){0};
    for (int h = 0; h < heads; h++) {
#pragma GCC unroll ${G}
        for (int j = 0; j < g; j++)
            dp[j] = (vf){0};
        for (int64_t k = (int64_t)h * hd; k < (int64_t)(h + 1) * hd; k += 2 * ${VEC}) {
            if (cur) {
                vf lo = {0}, hi = {0}, xl, xh;
                for (int i = 0; i < n; i++) {
                    const float w = weight[i * heads + h];
                    load_pair(cur[i] + k, &xl, &xh);
                    lo += w * xl;
                    hi += w * xh;
                }
                if (partial) {
${prefetch_partial}                    load_pair(partial + k, &xl, &xh);
                    lo = xl + a->alpha * lo;
                    hi = xh + a->alpha * hi;
                }
                store_pair(out + k, lo, hi);
                if (keep) {
                    *sq += lo * lo + hi * hi;
                    store_f32(keep + k, lo);
                    store_f32(keep + k + ${VEC}, hi);
                }
            }
            const vf ql = load_f32(qp + k), qh = load_f32(qp + k + ${VEC});
#pragma GCC unroll ${G}
            for (int j = 0; j < g; j++) {
                vf xl, xh;
${prefetch_rows}                load_pair(rows[j] + k, &xl, &xh);
                ss[j] += xl * xl;
                ss[j] += xh * xh;
                dp[j] += xl * ql;
                dp[j] += xh * qh;
            }
        }
        for (int j = 0; j < g; j++)
            dp_out[j * heads + h] = hsum(dp[j]);
    }
    for (int j = 0; j < g; j++)
        ss_out[j] = hsum(ss[j]);
}
]], { G = p.group, VEC = p.vec,
        prefetch_partial = prefetch(p, "partial + k", "                    "),
        prefetch_rows = prefetch(p, "rows[j] + k", "                ") })
end

-- A switch that calls sweep() with a constant group size, with and
-- without the mix, so each case compiles to register-resident code.
local function dispatch(p)
  local function cases(mix)
    return gen.each(p.group + 1, function(i)
      local g = i - 1
      if g == 0 and not mix then return "" end
      return string.format(
        "        case %d: sweep(a, qp, %s, g, rows, ss_out, dp_out); break;\n", g,
        mix and "cur, weight, partial, out, keep, sq" or "NULL, NULL, NULL, NULL, NULL, NULL")
    end)
  end
  return gen.subst([[
/* sweep() for a group of g <= ${G} rows; cur == NULL skips the mix. */
static void sweep_group(const struct attnres_cpu_mix_args *a, const float *qp,
                        const storage_t *const *cur, const float *weight,
                        const storage_t *partial, storage_t *out, float *keep, vf *sq,
                        int g, const storage_t *const *rows, float *ss_out, float *dp_out)
{
    if (cur) {
        switch (g) {
${mix_cases}        }
    } else {
        switch (g) {
${stat_cases}        }
    }
}
]], { G = p.group, mix_cases = cases(true), stat_cases = cases(false) })
end

function T.emit(p)
  local name = "attnres_" .. T.id(p)
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = gen.subst([[
${helpers}${pairs}
${softmax}
${sweep}
${dispatch}
/* The statistics of token t's n rows, in sweeps of at most ${G} rows sized
 * evenly (9 rows: 5 + 4), the first of which also mixes `cur` when given.
 * Leaves each row's score scale * dot / rms in score[i * heads + h]. */
static void stats_and_mix(const struct attnres_cpu_mix_args *a, const float *qp, int64_t t,
                          const storage_t *const *cur, const float *weight,
                          const storage_t *partial, storage_t *out, float *keep, vf *sq,
                          float *score)
{
    const int n = a->n, heads = a->heads;
    const storage_t *rows[n];
    float ss[n];
    for (int i = 0; i < n; i++)
        rows[i] = (const storage_t *)a->src[i] + t * a->src_stride[i];
    const int sweeps = (n + ${G} - 1) / ${G};
    for (int s = 0, i0 = 0; s < sweeps; s++) {
        const int g = n / sweeps + (s < n % sweeps);
        sweep_group(a, qp, s == 0 ? cur : NULL, weight, partial, out, keep, sq,
                    g, rows + i0, ss + i0, score + i0 * heads);
        i0 += g;
    }
    const float inv_d = 1.0f / (float)a->d;
    for (int i = 0; i < n; i++) {
        const float r = a->scale / sqrtf(ss[i] * inv_d + a->eps);
        for (int h = 0; h < heads; h++)
            score[i * heads + h] *= r;
    }
}

]], {
      helpers = storage.helpers(p.dtype, p.vec),
      pairs = storage.pair_helpers(p.dtype, p.vec),
      softmax = rowops.depth_softmax,
      sweep = sweep(p),
      dispatch = dispatch(p),
      G = p.group,
    }),
    name = name,
    threads = p.threads,
    abi = "cpu_mix",
    doc = [[
/* Mixes tokens [t0, t1): depth softmax of the folded query against the
 * RMS-normalised sources, applied to the raw rows. */]],
    body = gen.subst([[
    const int64_t d = a->d;
    const int n = a->n, heads = a->heads;
    float qp[d], keep[d], gp[d], score[n * heads], weight[n * heads];
    const storage_t *cur[n];
    if (t0 >= t1)
        return; /* the first sweep below would read token t0 */
    pair_order(a->query, qp, d);
    if (a->normed)
        pair_order(a->out_gain, gp, d);
    /* Token t0's scores; then each sweep mixes t and scores t + 1. */
    stats_and_mix(a, qp, t0, NULL, NULL, NULL, NULL, NULL, NULL, score);
    for (int64_t t = t0; t < t1; t++) {
        const storage_t *partial = a->partial ? (const storage_t *)a->partial + t * a->partial_stride : NULL;
        storage_t *out = (storage_t *)a->out + t * a->out_stride;
        storage_t *normed = a->normed ? (storage_t *)a->normed + t * a->normed_stride : NULL;
        depth_softmax(score, weight, n, heads);
        for (int i = 0; i < n; i++)
            cur[i] = (const storage_t *)a->src[i] + t * a->src_stride[i];
        vf sq = {0};
        float *kept = normed ? keep : NULL;
        if (t + 1 < t1)
            stats_and_mix(a, qp, t + 1, cur, weight, partial, out, kept, &sq, score);
        else
            sweep_group(a, qp, cur, weight, partial, out, kept, &sq, 0, NULL, NULL, NULL);
        if (normed) {
            /* keep holds the output in pair order; so does gp. */
            const float rs = 1.0f / sqrtf(hsum(sq) / (float)d + a->out_eps);
            for (int64_t k = 0; k < d; k += 2 * ${VEC})
                store_pair(normed + k, load_f32(keep + k) * rs * load_f32(gp + k),
                           load_f32(keep + k + ${VEC}) * rs * load_f32(gp + k + ${VEC}));
        }
    }
]], { VEC = p.vec }),
  }
  return src, name
end

return T
