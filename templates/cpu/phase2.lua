-- cpu/phase2.lua: phase 2 of Block AttnRes (DESIGN §1, two-phase form) as C
-- for the CPU backend: one routing site merges its phase-1 result (o1, lse)
-- with the block's running partial sum b.
--
-- Per token: optionally b += f first (the sublayer output, written back to
-- b so the add costs no separate pass over memory), gathering b's RMS
-- statistic and per-head dot products with the site's query in the same
-- sweep; without the add one sweep over b gathers them;
-- p2 = sigmoid(scale * r_b * dot - lse) per head; out = o1 + p2 * (b - o1);
-- and the optional output-norm epilogue.
--
-- Parameters and why they matter:
--   vec       fp32 lanes per vector (1 = scalar code, 8 = AVX2, 16 = AVX-512).
--   unroll    independent accumulators per loop, to hide FMA latency.
--   prefetch  1: software prefetch keeps memory busy through the passes that
--             read only cached data. The add pass asks for this token's o1
--             row and the merge pass for the next token's b and f rows, so
--             each arrives while a pass over cached data runs (into L2, so
--             that the rows in use stay in L1). 0 leaves it to the hardware.
--   store     how out and normed are written: "cached" with plain stores,
--             which first read each fresh line into the cache; "stream"
--             with non-temporal stores where the row is aligned to them,
--             which skip that read (out is a fifth of the bytes the
--             kernel moves with the fused add, and its read-for-ownership
--             a sixth more) and leave the row out of the cache. b, read
--             again at once, always takes plain stores.
--   threads   the most worker threads the launch spreads tokens over: a
--             launch parameter, not part of the source (lib/cpu_space.lua).
-- The kernel entry processes tokens [t0, t1); the runtime splits T.
--
-- bf16 vectors move in pairs (lib/c_storage.lua's pair helpers): one load
-- widens 2 * vec elements with two integer operations, even elements in one
-- vector and odd ones in the other, and one store rounds and interleaves
-- them back, where row order took a widening and a shift per vector to
-- load and a pack and a lane permutation to store. On a Zen 3 core without
-- AVX512-BF16 those shuffles had held the kernel to a quarter of the rate
-- of moving its rows (docs/cpu_kernels.md). The dot products then take the
-- query in the same order, and the norm epilogue its gain: each call
-- reorders them once. unroll counts pairs there, each with its own
-- accumulators.
--
-- Numerics: fp32 reductions, 64-bit offsets; with the fused add the scores
-- are taken from b as stored (rounded to the storage type), the same b a
-- later reader sees. NaN in one token's data reaches only that token.

local template = require("lib/template")
local storage = require("lib/c_storage")
local space = require("lib/cpu_space")
local kernel = require("lib/c_kernel")
local rowops = require("lib/c_rowops")
local prefetch = require("lib/c_prefetch")

local T = template.new("cpu", "phase2", {
  { name = "vec", values = { 1, 8, 16 } },
  { name = "unroll", values = { 1, 2, 4 } },
  { name = "prefetch", values = { 0, 1 } },
  { name = "store", values = { "cached", "stream" } },
  space.threads, -- 1, 2, 4, ... 64, set at launch (lib/cpu_space.lua)
}, {
  -- The runtime's built-in fallback: scalar code that fits every d and H,
  -- spread over all cores.
  generic = { vec = 1, unroll = 1, prefetch = 0, store = "cached", threads = 64 },
  -- The built-in kernels per ISA level (see cpu/mix_fused.lua).
  builtin = {
    avx512 = { vec = 16, unroll = 1, prefetch = 1, store = "cached", threads = 64 },
    avx2 = { vec = 8, unroll = 1, prefetch = 1, store = "cached", threads = 64 },
    sse2 = { vec = 8, unroll = 1, prefetch = 1, store = "cached", threads = 64 },
    neon = { vec = 8, unroll = 1, prefetch = 1, store = "cached", threads = 64 },
  },
})

-- AVX512-BF16 CPUs: the AVX-512 variant, compiled with it (see cpu/mix_fused.lua).
T.builtin.avx512bf16 = T.builtin.avx512

-- Scalar code is bound by its arithmetic, not by memory (and its stores
-- are narrower than a non-temporal store).
function T.constraint(p)
  return space.constraint(p) and not (p.vec == 1 and (p.prefetch == 1 or p.store == "stream"))
end

-- The id of a variant's source: its id without the thread count. Cached
-- stores keep the ids that databases already hold.
local function source_id(p)
  return string.format("phase2_c_%s_v%d_u%d_p%d%s", p.dtype, p.vec, p.unroll, p.prefetch,
                       p.store == "stream" and "_ss" or "")
end

space.entries(T, "cpu_phase2", source_id)

-- Stores vector `x`, or the pair `lo`, `hi`, at `dst`: past the caches for
-- p.store == "stream".
local function store_row_text(p, dst, x, indent)
  return storage.store_row_call(p.store == "stream", dst, x, indent)
end

local function store_pair_text(p, dst, lo, hi, indent)
  return storage.store_pair_call(p.store == "stream", dst, lo, hi, indent)
end

-- True where vectors move in pairs (see the header).
local function pairs_of(p)
  return p.dtype == "bf16" and p.vec > 1
end

-- A loop's step in elements: unroll vectors, or unroll pairs of them.
function T.step(p)
  return (pairs_of(p) and 2 or 1) * p.vec * p.unroll
end

-- The pair forms of the add-and-statistics step, the merge step and the
-- norm epilogue (see the header): per pair j of a step, accumulators 2j
-- (even elements) and 2j + 1 (odd ones).
local function pair_steps(p)
  local u, v = p.unroll, p.vec
  return {
    add_stats = gen.each(u, function(i)
      local off, lo, hi = (i - 1) * 2 * v, 2 * (i - 1), 2 * (i - 1) + 1
      return gen.subst([[
                    {
                        vf bl, bh, fl, fh;
                        load_pair(b + kb + ${OFF}, &bl, &bh);
                        load_pair(f + kb + ${OFF}, &fl, &fh);
                        store_pair(b + kb + ${OFF}, bl + fl, bh + fh);
                        vf xl, xh;
                        load_pair(b + kb + ${OFF}, &xl, &xh);
                        ss${LO} += xl * xl;
                        ss${HI} += xh * xh;
                        dp${LO} += xl * load_f32(qp + kb + ${OFF});
                        dp${HI} += xh * load_f32(qp + kb + ${OFF_HI});
                    }]], { OFF = off, OFF_HI = off + v, LO = lo, HI = hi })
    end, "\n"),
    merge = gen.each(u, function(i)
      local off = (i - 1) * 2 * v
      return gen.subst([[
                {
                    const int64_t k = kb + ${OFF};
                    vf ol, oh, bl, bh;
                    load_pair(o + k, &ol, &oh);
                    load_pair(b + k, &bl, &bh);
                    const vf yl = ol + p2 * (bl - ol), yh = oh + p2 * (bh - oh);
${store}                    if (normed) {
                        sq += yl * yl + yh * yh;
                        store_f32(keep + k, yl);
                        store_f32(keep + k + ${VEC}, yh);
                    }
                }]], { OFF = off, VEC = v, store = store_pair_text(p, "out + k", "yl", "yh", "                    ") })
    end, "\n"),
    epilogue = gen.subst([[
            /* keep holds the output in pair order; so does gp. */
            for (int64_t k = 0; k < d; k += 2 * ${VEC}) {
                const vf lo = load_f32(keep + k) * rs * load_f32(gp + k);
                const vf hi = load_f32(keep + k + ${VEC}) * rs * load_f32(gp + k + ${VEC});
${store}            }
]], { VEC = v, store = store_pair_text(p, "normed + k", "lo", "hi", "                ") }),
    decls = [[
    /* The query and the gain in pair order (qp, gp); without the fused
     * add, row_stats reads the query in row order. */
    float qp[a->sublayer ? d : 1], gp[a->normed ? d : 1];
    if (a->sublayer)
        pair_order(a->query, qp, d);
    if (a->normed)
        pair_order(a->out_gain, gp, d);
]],
    zero_stats = rowops.per_lane(2 * u, "                vf ss%d = {0}, dp%d = {0};"),
    sum_ss = rowops.sum_lanes(2 * u, "ss"),
    sum_dp = rowops.sum_lanes(2 * u, "dp"),
  }
end

function T.emit(p)
  local name = space.kernel_name(source_id(p))
  local u = p.unroll
  local paired = pairs_of(p)
  local vars = {
    helpers = storage.helpers(p.dtype, p.vec) .. (paired and storage.pair_helpers(p.dtype, p.vec) or ""),
    row_stats = rowops.row_stats(p),
    sigmoid = rowops.sigmoid,
    STEP = T.step(p),
    pair_decls = "",
    VEC = p.vec,
    store_normed = store_row_text(p, "normed + k", "y", "                "),
    fence = p.store == "stream" and "    stream_fence();\n" or "",
    stream = p.store == "stream" and storage.stream_helpers(p.vec, paired) or "",
    next_rows = p.prefetch == 0 and "" or [[
        /* The rows the merge pass prefetches: token t + 1's b and f, or,
         * without a fused add (no pass to prefetch o1 in), its o1 row. The
         * last token prefetches its own rows again, which are cached. */
        const int64_t tn = t + 1 < t1 ? t + 1 : t;
        storage_t *b_next = (storage_t *)a->partial + tn * a->partial_stride;
        const storage_t *f_next = a->sublayer ? (const storage_t *)a->sublayer + tn * a->sublayer_stride
                                              : (const storage_t *)a->o1 + tn * a->o1_stride;
]],
    prefetch_add_stats = p.prefetch == 0 and "" or
      prefetch.lines("o + kb", T.step(p) * storage.size[p.dtype], 0, "                    ", false, 2),
    prefetch_merge = p.prefetch == 0 and "" or
      prefetch.lines("b_next + kb", T.step(p) * storage.size[p.dtype], 0, "                ", true, 2) ..
      prefetch.lines("f_next + kb", T.step(p) * storage.size[p.dtype], 0, "                ", false, 2),
    -- b += f, then the statistics of b as stored (read back from the
    -- store), lane by lane as row_stats sums them.
    add_stats = gen.each(u, function(i)
      local off, j = (i - 1) * p.vec, i - 1
      return string.format(
        "                    store_row(b + kb + %d, load_row(b + kb + %d) + load_row(f + kb + %d));\n" ..
        "                    const vf x%d = load_row(b + kb + %d);\n" ..
        "                    ss%d += x%d * x%d;\n" ..
        "                    dp%d += x%d * load_f32(a->query + kb + %d);",
        off, off, off, j, off, j, j, j, j, j, off)
    end, "\n"),
    zero_stats = rowops.per_lane(u, "                vf ss%d = {0}, dp%d = {0};"),
    sum_ss = rowops.sum_lanes(u, "ss"),
    sum_dp = rowops.sum_lanes(u, "dp"),
    merge = gen.each(u, function(i)
      local off = (i - 1) * p.vec
      return string.format(
        "                {\n" ..
        "                    const int64_t k = kb + %d;\n" ..
        "                    const vf ov = load_row(o + k);\n" ..
        "                    const vf y = ov + p2 * (load_row(b + k) - ov);\n" ..
        store_row_text(p, "out + k", "y", "                    ") ..
        "                    if (normed) {\n" ..
        "                        sq += y * y;\n" ..
        "                        store_f32(keep + k, y);\n" ..
        "                    }\n" ..
        "                }", off)
    end, "\n"),
  }
  vars.epilogue = gen.subst([[
            for (int64_t k = 0; k < d; k += ${VEC}) {
                const vf y = load_f32(keep + k) * rs * load_f32(a->out_gain + k);
${store_normed}            }
]], vars)
  if paired then
    for k, v in pairs(pair_steps(p)) do
      vars[k == "decls" and "pair_decls" or k] = v
    end
  end
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = gen.subst([[
${helpers}${stream}
${row_stats}
${sigmoid}
]], vars),
    name = name,
    abi = "cpu_phase2",
    body = gen.subst([[
    const int64_t d = a->d;
    const int heads = a->heads;
    const int64_t hd = d / heads;
    const float inv_d = 1.0f / (float)d, eps = a->eps, scale = a->scale;
    float dot[heads], keep[a->normed ? d : 1];
${pair_decls}    for (int64_t t = t0; t < t1; t++) {
        storage_t *b = (storage_t *)a->partial + t * a->partial_stride;
        const storage_t *o = (const storage_t *)a->o1 + t * a->o1_stride;
        const float *lse = a->lse + t * a->lse_stride;
        storage_t *out = (storage_t *)a->out + t * a->out_stride;
        storage_t *normed = a->normed ? (storage_t *)a->normed + t * a->normed_stride : NULL;
${next_rows}        float sumsq = 0.0f;
        if (a->sublayer) {
            /* The fused residual add: b += f, stored at once, and the
             * statistics of b as stored in the same sweep, so that b is
             * swept once before the merge instead of twice. */
            const storage_t *f = (const storage_t *)a->sublayer + t * a->sublayer_stride;
            for (int h = 0; h < heads; h++) {
${zero_stats}
                for (int64_t kb = (int64_t)h * hd; kb < (int64_t)(h + 1) * hd; kb += ${STEP}) {
${prefetch_add_stats}${add_stats}
                }
                sumsq += hsum(${sum_ss});
                dot[h] = hsum(${sum_dp});
            }
        } else {
            sumsq = row_stats(b, a->query, hd, heads, dot);
        }
        const float r = 1.0f / sqrtf(sumsq * inv_d + eps);
        vf sq = {0};
        for (int h = 0; h < heads; h++) {
            /* sigmoid(s2 - lse): the weight of b against the n sources of o1. */
            const float p2 = sigmoid(scale * r * dot[h] - lse[h]);
            const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
            for (int64_t kb = k0; kb < k1; kb += ${STEP}) {
${prefetch_merge}${merge}
            }
        }
        if (normed) {
            const float rs = 1.0f / sqrtf(hsum(sq) * inv_d + a->out_eps);
${epilogue}        }
    }
${fence}]], vars),
  }
  return src, name
end

return T
