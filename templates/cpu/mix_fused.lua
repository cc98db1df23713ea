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
-- What each choice does and what it was measured to gain, on which CPU:
-- docs/cpu_kernels.md, section templates/cpu/mix_fused.lua.
--
-- Parameters:
--   vec     fp32 lanes per vector (8 = AVX2, 16 = AVX-512); each step of the
--           sweep handles 2 * vec elements as a pair of vectors, in the
--           order lib/c_storage.lua's pair helpers choose (for bf16 the
--           even and odd elements, widened by two integer operations).
--   group   the most next-token rows whose statistics one sweep gathers:
--           2 * group vector accumulators must fit in the registers. More
--           sources than that take further sweeps over the extra rows.
--   mix     where the mix of token t runs: "fused" in the first statistics
--           sweep, one pass over the row; "apart" in a sweep of its own
--           before the statistics sweeps, for 16 vector registers (AVX2),
--           where a fused sweep's working set does not fit and spills.
--   burst   the mix's steps per burst. 1: each step reads all n sources at
--           the same offset, one line each. 4: a burst reads 4 steps' lines
--           of one source, then of the next, into 4 independent sums, so
--           that rows starting at the same page offset (one L1 set, 8
--           ways) spread their lines in flight over 4 sets. The steps after
--           the last whole burst of a head slice run one at a time. "auto"
--           (the built-ins' only) bursts in launches whose sources' rows
--           lie a multiple of 4 KiB apart, and steps one at a time
--           otherwise: a built-in meets every layout.
--   prefetch  what software prefetches ask for while a sweep streams the
--           next token's rows, since the sweep's instructions per line
--           leave too few lines in flight for the out-of-order window
--           alone: "none" leaves it to the hardware prefetchers; "token"
--           asks, into L2, for the rows of the token after next (and the
--           next partial row) at the sweep's offset; "both" also asks for
--           the next token's rows 1024 bytes ahead into L1; "sweep" (mix
--           apart only) has each sweep ask for the rows the sweep after it
--           reads first, so that memory streams while the mix reads L2;
--           "all" (fused only) does what "both" does and has the mix ask
--           for the token after next as well, since the first sweep's long
--           steps leave memory idle. "all" is tuned only for launches that
--           move FROM_MIX_MIN_BYTES and more.
--   dot     how the statistics are summed: "fma" widens each bf16 pair to
--           fp32 and multiplies-adds (4 vector FMAs per 64-byte line);
--           "bf16" (bf16 rows, 16 lanes) uses AVX512-BF16's pair dot
--           products: x.x in one, and x.q in two against the query split
--           into high and low bf16 halves (q - hi is exact in bf16 to 2^-16
--           of q), so the products are the fp32 ones. A compiler without
--           __AVX512BF16__ (the CPU lacks it) builds the "fma" sums.
--   store   how the output rows (out, and normed with the epilogue) are
--           written: "cached" with plain stores, which first read each
--           fresh line into the cache; "stream" with non-temporal stores
--           where the row is aligned to them (lib/c_storage.lua), which
--           skip that read but leave the rows out of the cache for a reader
--           soon after. The tuner times both per T bucket.
--   threads the most worker threads the launch spreads tokens over: a
--           launch parameter, not part of the source (lib/cpu_space.lua).
-- The kernel entry processes tokens [t0, t1); the runtime splits T.

local template = require("lib/template")
local storage = require("lib/c_storage")
local rowops = require("lib/c_rowops")
local space = require("lib/cpu_space")
local prefetch_lib = require("lib/c_prefetch")
local kernel = require("lib/c_kernel")

local T = template.new("cpu", "mix", {
  { name = "vec", values = { 8, 16 } },
  { name = "group", values = { 4, 8 } },
  { name = "mix", values = { "fused", "apart" } },
  { name = "burst", values = { 1, 4, "auto" } },
  { name = "prefetch", values = { "none", "token", "both", "sweep", "all" } },
  { name = "dot", values = { "fma", "bf16" } },
  { name = "store", values = { "cached", "stream" } },
  space.threads, -- 1, 2, 4, ... 64, set at launch (lib/cpu_space.lua)
}, {
  -- The runtime's built-in kernels per ISA level (compiled into the library
  -- with that level's flags, chosen at device open), spread over all cores;
  -- head widths that are not a multiple of the step take cpu/mix.lua's
  -- scalar generic kernel. Each takes what every CPU of its level has and
  -- what serves small T, where a fallback is most likely met: no software
  -- prefetch, bursts chosen per launch, FMA statistics, plain stores, and
  -- for AVX2 the mix apart (docs/cpu_kernels.md, "The built-in kernels").
  builtin = {
    avx512 = { vec = 16, group = 8, mix = "fused", burst = "auto", prefetch = "none", dot = "fma", store = "cached", threads = 64 },
    avx2 = { vec = 8, group = 8, mix = "apart", burst = "auto", prefetch = "none", dot = "fma", store = "cached", threads = 64 },
    sse2 = { vec = 8, group = 4, mix = "fused", burst = "auto", prefetch = "none", dot = "fma", store = "cached", threads = 64 },
    neon = { vec = 8, group = 4, mix = "fused", burst = "auto", prefetch = "none", dot = "fma", store = "cached", threads = 64 },
  },
})

-- CPUs with AVX512-BF16 take the AVX-512 variant compiled with it as well,
-- for its one-instruction bf16 rounding in the stores (lib/c_storage.lua).
T.builtin.avx512bf16 = T.builtin.avx512

local prefetch_letter = { none = "n", token = "t", both = "b", sweep = "s", all = "a" }

-- The prefetches' parts: the token-ahead rows in the statistics sweeps, the
-- next token's rows 1024 bytes ahead into L1, and the token after next from
-- the mix as well.
local token_ahead = { token = true, both = true, all = true }
local near_l1 = { both = true, all = true }
local from_mix = { all = true }

-- The id of a variant's source: its id without the thread count. Bursts
-- of one step and the fused mix leave the id as it was before either
-- choice existed, so an id keeps naming the same kernel.
local function source_id(p)
  return string.format("mix_c_%s_fused_v%d_g%d%s%s_p%s_d%s_s%s", p.dtype, p.vec, p.group,
                       p.mix == "fused" and "" or "_ma",
                       p.burst == 1 and "" or "_b" .. p.burst, prefetch_letter[p.prefetch],
                       p.dot, p.store:sub(1, 1))
end

space.entries(T, "cpu_mix", source_id)

-- Whether p is one of T.builtin's variants (of any dtype).
local function builtin_form(p)
  for _, b in pairs(T.builtin) do
    local same = true
    for k, v in pairs(b) do
      if p[k] ~= v then same = false end
    end
    if same then return true end
  end
  return false
end

-- The bf16 pair dot products exist for bf16 rows in 512-bit vectors only.
-- The mix apart is for 8 lanes, whose registers a fused sweep overfills,
-- and for 16 lanes with the sweep-ahead prefetches, the one pairing where
-- it won at 16 lanes; "sweep" needs the mix apart and "all" the mix fused.
-- Bursts "auto" exist as the built-ins alone (backend_ops --variant 'builtin-*'
-- runs them at every ISA level the host has).
function T.constraint(p)
  return (p.dot == "fma" or (p.dtype == "bf16" and p.vec == 16)) and
      (p.mix == "fused" or p.vec == 8 or p.prefetch == "sweep") and
      (p.prefetch ~= "sweep" or p.mix == "apart") and
      (not from_mix[p.prefetch] or p.mix == "fused") and
      (p.burst ~= "auto" or builtin_form(p))
end

-- Tuned sources fix the problem's source count (see dispatch()); the
-- built-ins and every other use of the template emit the general source.
function T.specialize(p, problem, device)
  return { n = problem.n }
end

-- One sweep step covers a pair of vectors.
function T.step(p)
  return 2 * p.vec
end

function T.applies(p, problem, device)
  if p.dot == "bf16" and device.arch ~= "x86_64-avx512" then
    return false, "the bf16 dot products need AVX-512"
  end
  if p.burst == "auto" then
    return false, "bursts \"auto\" are the built-ins' choice per launch; tuning measures 1 and 4"
  end
  return space.applies(T, p, problem, device)
end

-- What the tuner leaves out unless told not to (attnres tune --no-prune):
-- variants that run the problem right but were measured not to win there.

-- Bursts of 4 are tuned where they were measured, on head slices of 512
-- elements and more (MHAR's heads and up); shorter slices keep bursts of 1,
-- so that small shapes (the ci preset's) do not tune twice as many variants.
local BURST_MIN_SLICE = 512

-- The prefetches from the mix are tuned for launches that move at least
-- this many bytes (twice the 32 MiB L3 of the CPUs measured): their rows
-- come from memory, where the prefetches pay. In cache they are
-- instructions spent for nothing.
local FROM_MIX_MIN_BYTES = 64 * 1024 * 1024

function T.prune(p, problem, device)
  if p.burst ~= "auto" and p.burst > 1 and problem.d // problem.heads < BURST_MIN_SLICE then
    return string.format("bursts of %d are tuned for head slices of %d elements and more", p.burst,
                         BURST_MIN_SLICE)
  end
  if from_mix[p.prefetch] then
    -- The rows a launch reads and writes: sources, output, and the partial
    -- and normed rows where the problem has them.
    local rows = problem.n + 1 + (problem.form == "additive" and 1 or 0) + (problem.epilogue and 1 or 0)
    local bytes = rows * problem.t * problem.d * storage.size[p.dtype]
    if bytes < FROM_MIX_MIN_BYTES then
      return string.format("prefetch \"%s\" is tuned for launches of %d MiB and more, not %.1f", p.prefetch,
                           FROM_MIX_MIN_BYTES // (1024 * 1024), bytes / (1024 * 1024))
    end
  end
  return nil
end

-- Prefetches of every line of a sweep step: for "token" and "both", at
-- `ptr` plus `next` elements (the next token's row) into L2, when `next` is
-- given (`cond` is true), and for "both" also 1024 bytes ahead of `ptr`
-- into L1 where `l1` is set. "" when nothing is prefetched.
local function prefetch(p, ptr, next, cond, indent, l1)
  local step = 2 * p.vec * storage.size[p.dtype]
  if token_ahead[p.prefetch] then
    local near = (near_l1[p.prefetch] and l1) and prefetch_lib.lines(ptr, step, 1024, indent) or ""
    return indent .. "if (" .. cond .. ") {\n" ..
        prefetch_lib.lines(ptr .. " + " .. next, step, 0, indent .. "    ", false, 2) ..
        indent .. "}\n" .. near
  end
  return ""
end

-- For prefetch "sweep": the declarations of pf[], the n_ahead rows in
-- `ahead` (the rows the next sweep reads first), the last repeated up to
-- p.group entries; and the statements that prefetch, into L2, the lines at
-- offset k of pf[0, count) when there are rows (`count`, a C expression
-- the compiler knows, is at least n_ahead). A repeated prefetch of a line
-- on its way costs less than a test per row. "" for other prefetches.
local function ahead_rows(p, count)
  if p.prefetch ~= "sweep" then
    return "    (void)ahead; /* read by the sweep-ahead prefetches only */\n    (void)n_ahead;\n"
  end
  return gen.subst([[
    const int n_pf = ${COUNT};
    const storage_t *pf[${G}];
#pragma GCC unroll ${G}
    for (int j = 0; j < ${G}; j++)
        pf[j] = n_ahead ? ahead[j < n_ahead ? j : n_ahead - 1] : NULL;
]], { G = p.group, COUNT = count })
end

local function ahead_prefetch(p, count, indent)
  if p.prefetch ~= "sweep" then return "" end
  local step = 2 * p.vec * storage.size[p.dtype]
  return gen.subst([[
${I}if (n_ahead) {
#pragma GCC unroll ${G}
${I}    for (int j = 0; j < ${COUNT}; j++) {
${lines}${I}    }
${I}}
]], { I = indent, G = p.group, COUNT = count,
      lines = prefetch_lib.lines("pf[j] + k", step, 0, indent .. "        ", false, 2) })
end

-- The statistics of one row step, `x` at `src`: its sum of squares into
-- `ss` and its dot product with the query into `dp`.
local function stats_step(p, src, ss, dp, indent)
  if p.dot == "bf16" then
    return gen.subst([[
${I}#if defined(__AVX512BF16__)
${I}dot_stats(${SRC}, qh, ql, &${SS}, &${DP});
${I}#else
${I}load_pair(${SRC}, &xl, &xh);
${I}${SS} += xl * xl;
${I}${SS} += xh * xh;
${I}${DP} += xl * qpl;
${I}${DP} += xh * qph;
${I}#endif
]], { I = indent, SRC = src, SS = ss, DP = dp })
  end
  return gen.subst([[
${I}load_pair(${SRC}, &xl, &xh);
${I}${SS} += xl * xl;
${I}${SS} += xh * xh;
${I}${DP} += xl * qpl;
${I}${DP} += xh * qph;
]], { I = indent, SRC = src, SS = ss, DP = dp })
end

-- The query forms the statistics read: the pair-ordered fp32 query (qp)
-- for "fma", and for "bf16" also its high and low bf16 halves in row order.
local function dot_helpers(p)
  if p.dot ~= "bf16" then return "" end
  return [[
#if defined(__AVX512BF16__)
/* ss += x.x and dp += x.(qh + ql) over 32 bf16 as 16 pair sums: each pair
 * product is exact in fp32 and each sum rounds once, as an FMA's would. */
static inline void dot_stats(const uint16_t *p, __m512bh qh, __m512bh ql, vf *ss, vf *dp)
{
    __m512bh x;
    memcpy(&x, p, sizeof x);
    *ss = (vf)_mm512_dpbf16_ps((__m512)*ss, x, x);
    *dp = (vf)_mm512_dpbf16_ps(_mm512_dpbf16_ps((__m512)*dp, x, qh), x, ql);
}

/* Splits the query into bf16 halves, q ~ hi + lo to 2^-16 of q, 16 at a
 * time (once per launch: 0.73 us for d = 7168, where element by element
 * took 0.97). d is a multiple of the sweep's 32-element step. */
static void split_query(const float *q, uint16_t *hi, uint16_t *lo, int64_t d)
{
    for (int64_t k = 0; k < d; k += 16) {
        const __m512 x = _mm512_loadu_ps(q + k);
        const __m256bh h = _mm512_cvtneps_pbh(x);
        const __m512 hx = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
        const __m256bh l = _mm512_cvtneps_pbh(_mm512_sub_ps(x, hx));
        _mm256_storeu_si256((__m256i *)(void *)(hi + k), (__m256i)h);
        _mm256_storeu_si256((__m256i *)(void *)(lo + k), (__m256i)l);
    }
}
#endif
]]
end

-- Stores a pair of vectors at `dst`: past the caches for p.store == "stream".
local function store_pair_text(p, dst, lo, hi, indent)
  return storage.store_pair_call(p.store == "stream", dst, lo, hi, indent)
end

-- The mix of token t over one burst of `ch` steps at k0 (`k` for one
-- step), then the partial, the store and the kept output per step. One
-- step keeps two sums over alternate sources: a single one would be a
-- chain of n dependent FMAs. A burst of several steps reads the sources
-- one at a time, `ch` lines of each in a row, into `ch` independent sums.
-- The end of one mix step at `k`, with the step's sums in lo and hi: the
-- partial (alpha read from `alpha`), the store, and the kept output, whose
-- sum of squares grows in `sq` (a vf lvalue).
local function mix_finish(p, sq, alpha)
  return gen.subst([[
                if (partial) {
${prefetch_partial}                    load_pair(partial + k, &xl, &xh);
                    lo = xl + ${ALPHA} * lo;
                    hi = xh + ${ALPHA} * hi;
                }
${store_out}                if (keep) {
                    ${SQ} += lo * lo + hi * hi;
                    store_f32(keep + k, lo);
                    store_f32(keep + k + ${VEC}, hi);
                }
]], { VEC = p.vec, SQ = sq, ALPHA = alpha,
      prefetch_partial = prefetch(p, "partial + k", "partial_next", "partial_next",
                                  "                    "),
      store_out = store_pair_text(p, "out + k", "lo", "hi", "                ") })
end

-- For prefetch "all": statements that ask, into L2, for the `bytes` bytes
-- of source `idx`'s row of the token after next at element offset `k`, when
-- that token is in the launch (`next` is given). "" for other prefetches.
local function mix_prefetch(p, idx, k, bytes, indent)
  if not from_mix[p.prefetch] then return "" end
  local ptr = string.format("cur[%s] + %s + 2 * a->src_stride[%s]", idx, k, idx)
  return indent .. "if (next) {\n" .. prefetch_lib.lines(ptr, bytes, 0, indent .. "    ", false, 2) ..
      indent .. "}\n"
end

local function mix_burst(p, ch)
  local finish = mix_finish(p, "*sq", "a->alpha")
  local step = 2 * p.vec * storage.size[p.dtype]
  if ch == 1 then
    return gen.subst([[
            if (cur) {
                /* Two sums over alternate sources: one would be a chain of
                 * n dependent FMAs per step. */
                const int64_t k = k0;
                vf lo = {0}, hi = {0}, lo2 = {0}, hi2 = {0}, yl, yh;
                int i = 0;
                for (; i + 1 < n; i += 2) {
                    const float w = weight[i * heads + h], w2 = weight[(i + 1) * heads + h];
${prefetch_pair}                    load_pair(cur[i] + k, &xl, &xh);
                    load_pair(cur[i + 1] + k, &yl, &yh);
                    lo += w * xl;
                    hi += w * xh;
                    lo2 += w2 * yl;
                    hi2 += w2 * yh;
                }
                if (i < n) {
                    const float w = weight[i * heads + h];
${prefetch_last}                    load_pair(cur[i] + k, &xl, &xh);
                    lo += w * xl;
                    hi += w * xh;
                }
                lo += lo2;
                hi += hi2;
${finish}            }
]], { finish = finish,
      prefetch_pair = mix_prefetch(p, "i", "k", step, "                    ") ..
          mix_prefetch(p, "i + 1", "k", step, "                    "),
      prefetch_last = mix_prefetch(p, "i", "k", step, "                    ") })
  end
  return gen.subst([[
            if (cur) {
                vf mlo[${CH}], mhi[${CH}];
#pragma GCC unroll ${CH}
                for (int c = 0; c < ${CH}; c++)
                    mlo[c] = mhi[c] = (vf){0};
                for (int i = 0; i < n; i++) {
                    const float w = weight[i * heads + h];
${prefetch_burst}#pragma GCC unroll ${CH}
                    for (int c = 0; c < ${CH}; c++) {
                        load_pair(cur[i] + k0 + c * 2 * ${VEC}, &xl, &xh);
                        mlo[c] += w * xl;
                        mhi[c] += w * xh;
                    }
                }
#pragma GCC unroll ${CH}
                for (int c = 0; c < ${CH}; c++) {
                    const int64_t k = k0 + c * 2 * ${VEC};
                    vf lo = mlo[c], hi = mhi[c];
${finish}                }
            }
]], { CH = ch, VEC = p.vec, finish = gen.indent(finish, 4),
      prefetch_burst = mix_prefetch(p, "i", "k0", ch * step, "                    ") })
end

-- The statistics of the g next-token rows over one burst of `ch` steps
-- at k0: per step, the query's forms once and every row's sums.
local function stats_burst(p, ch)
  local qsplit = p.dot == "bf16"
  local text = [[
#pragma GCC unroll ${CH}
            for (int c = 0; c < ${CH}; c++) {
                const int64_t k = k0 + c * 2 * ${VEC};
${ahead}${load_query}#pragma GCC unroll ${G}
                for (int j = 0; j < g; j++) {
${prefetch_rows}${stats}                }
            }
]]
  if ch == 1 then
    text = [[
            {
                const int64_t k = k0;
${ahead}${load_query}#pragma GCC unroll ${G}
                for (int j = 0; j < g; j++) {
${prefetch_rows}${stats}                }
            }
]]
  end
  return gen.subst(text, { CH = ch, G = p.group, VEC = p.vec,
        ahead = ahead_prefetch(p, "n_pf", "                "),
        prefetch_rows = prefetch(p, "rows[j] + k", "next[j]", "next", "                    ", true),
        stats = stats_step(p, "rows[j] + k", "ss[j]", "dp[j]", "                    "),
        load_query = gen.subst(qsplit and [[
#if defined(__AVX512BF16__)
                __m512bh qh, ql;
                memcpy(&qh, q->hi + k, sizeof qh);
                memcpy(&ql, q->lo + k, sizeof ql);
#else
                const vf qpl = load_f32(q->pair + k), qph = load_f32(q->pair + k + ${VEC});
#endif
]] or [[
                const vf qpl = load_f32(q->pair + k), qph = load_f32(q->pair + k + ${VEC});
]], { VEC = p.vec }) })
end

-- The sweep, inlined once per group size so that its accumulators become
-- registers: `g` is a constant in every call the dispatcher makes. Each
-- head's slice runs in bursts of `burst` steps; the steps left over after
-- the last whole burst run one at a time. Bursts "auto" run the bursts of
-- 4 in launches that q->bursts marks, and every step one at a time in the
-- others.
local function sweep(p)
  local burst = function(ch)
    return gen.subst([[
            vf xl, xh;
${mix}${stats}]], { mix = mix_burst(p, ch), stats = stats_burst(p, ch) })
  end
  local tail = p.burst == 1 and "" or gen.subst([[
        for (; k0 < end; k0 += 2 * ${VEC}) {
${one}        }
]], { VEC = p.vec, one = burst(1) })
  local ch = p.burst == "auto" and 4 or p.burst
  local whole = gen.subst([[
        for (; ${cond}; k0 += ${CH} * 2 * ${VEC}) {
${burst}        }
]], { CH = ch, VEC = p.vec, burst = burst(ch),
      cond = ch == 1 and "k0 < end" or string.format("k0 + %d * 2 * %d <= end", ch, p.vec) })
  if p.burst == "auto" then
    -- Indented a level further, but for the pragmas' first column.
    whole = "        if (q->bursts) {\n" .. gen.indent(whole, 4):gsub("\n    #", "\n#") .. "        }\n"
  end
  return gen.subst([[
/* One pass over the row. With `cur`, mixes the current token's n rows
 * (weights known) into `out`; for the g rows in `rows`, gathers the sum of
 * squares (ss_out[j]) and, per head, the dot product with the query
 * (dp_out[j * heads + h]). `next` holds each row's offset to the next
 * token's row, to prefetch, or is NULL; `ahead` the n_ahead <= ${G} rows
 * that the next sweep reads first, to prefetch. */
static inline __attribute__((always_inline)) void sweep(
    const struct attnres_cpu_mix_args *a, const struct query_forms *q,
    const storage_t *const *cur, const float *weight, const storage_t *partial,
    int64_t partial_next, storage_t *out, float *keep, vf *sq,
    int g, const storage_t *const *rows, const int64_t *next, float *ss_out, float *dp_out,
    const storage_t *const *ahead, int n_ahead)
{
    const int64_t d = a->d, hd = d / a->heads;
    const int n = a->n, heads = a->heads;
    (void)partial_next; /* read by the token-ahead prefetches only */
    (void)next;
${ahead_rows}    vf ss[${G}], dp[${G}];
#pragma GCC unroll ${G}
    for (int j = 0; j < g; j++)
        ss[j] = (vf){0};
    for (int h = 0; h < heads; h++) {
#pragma GCC unroll ${G}
        for (int j = 0; j < g; j++)
            dp[j] = (vf){0};
        const int64_t end = (int64_t)(h + 1) * hd;
        int64_t k0 = (int64_t)h * hd;
${whole}${tail}        for (int j = 0; j < g; j++)
            dp_out[j * heads + h] = hsum(dp[j]);
    }
    for (int j = 0; j < g; j++)
        ss_out[j] = hsum(ss[j]);
}
]], { G = p.group, whole = whole, tail = tail,
        ahead_rows = ahead_rows(p, "g ? g : " .. p.group) })
end

-- Removes n spaces from the start of every line of text that has them.
local function outdent(text, n)
  local pad = string.rep(" ", n)
  return (text:gsub("([^\n]*)(\n?)", function(line, nl)
    if line:sub(1, n) == pad then line = line:sub(n + 1) end
    return line .. nl
  end))
end

-- The most sources the mix alone unrolls for: 9 weight vectors, the 4
-- sums and 2 temporaries fill AVX2's 16 registers, and K3's and MHAR's
-- sites mix at most 9 sources.
local MIX_FIXED_MAX = 9

-- The mix alone uses a constant n in bursts of one step (mix_fixed()): the
-- steps of a burst of 4 need 8 sums next to the weights, more than fit.
-- Bursts "auto" take it in the launches that do not burst.
local function mix_fixed_applies(p)
  return p.burst == 1 or p.burst == "auto"
end

-- mix_fixed(): the mix of token t alone (no statistics) for a constant
-- n <= MIX_FIXED_MAX, so that the source pointers and the weights' vectors
-- stay in registers across the row. With a runtime n, every step loads each
-- source's pointer and broadcasts its weight again (a store through `out`
-- or `keep` might have changed them): 7 instructions per source and step
-- instead of 5. The sums run in the same order, so the output's bits are
-- those of the runtime-n sweep.
local function mix_fixed(p)
  if not mix_fixed_applies(p) then return "" end
  return gen.subst([[
/* The mix of token t alone for a constant n <= ${MAX} (inlined once per n):
 * the pointers and the weights live in registers across the row. */
static inline __attribute__((always_inline)) void mix_fixed(
    const struct attnres_cpu_mix_args *a, const storage_t *const *cur, const float *weight,
    const storage_t *partial, int64_t partial_next, storage_t *out, float *keep, vf *sq,
    const storage_t *const *ahead, int n_ahead, const int n)
{
    const int64_t hd = a->d / a->heads;
    const int heads = a->heads;
    const float alpha = a->alpha;
    (void)partial_next; /* read by the token-ahead prefetches only */
    const storage_t *src[${MAX}];
#pragma GCC unroll ${MAX}
    for (int i = 0; i < n; i++)
        src[i] = cur[i];
${hoist_ahead}    vf sum_sq = keep ? *sq : (vf){0};
    for (int h = 0; h < heads; h++) {
        vf w[${MAX}];
#pragma GCC unroll ${MAX}
        for (int i = 0; i < n; i++)
            w[i] = (vf){0} + weight[i * heads + h];
        const int64_t end = (int64_t)(h + 1) * hd;
        for (int64_t k = (int64_t)h * hd; k < end; k += 2 * ${VEC}) {
${ahead}            /* Two sums over alternate sources, as in sweep(). */
            vf xl, xh, yl, yh, lo = {0}, hi = {0}, lo2 = {0}, hi2 = {0};
#pragma GCC unroll ${MAX}
            for (int i = 0; i + 1 < n; i += 2) {
                load_pair(src[i] + k, &xl, &xh);
                load_pair(src[i + 1] + k, &yl, &yh);
                lo += w[i] * xl;
                hi += w[i] * xh;
                lo2 += w[i + 1] * yl;
                hi2 += w[i + 1] * yh;
            }
            if (n % 2) {
                load_pair(src[n - 1] + k, &xl, &xh);
                lo += w[n - 1] * xl;
                hi += w[n - 1] * xh;
            }
            lo += lo2;
            hi += hi2;
${finish}        }
    }
    if (keep)
        *sq = sum_sq;
}

]], { MAX = MIX_FIXED_MAX, VEC = p.vec, finish = outdent(mix_finish(p, "sum_sq", "alpha"), 4),
        ahead = ahead_prefetch(p, "n_pf", "            "),
        -- The size of the first statistics group, as stats_and_mix() splits
        -- n rows: the most rows the sweep after this one reads.
        hoist_ahead = ahead_rows(p, gen.subst("n / ((n + ${G} - 1) / ${G}) + (n % ((n + ${G} - 1) / ${G}) > 0)",
                                              { G = p.group })) })
end

-- Bursts "auto": a launch bursts when the rows of every source lie a
-- multiple of 4 KiB apart, so that the rows of consecutive tokens, and with
-- them the lines that one step reads, share L1 sets.
local ROWS_ALIAS = [[

/* Whether every source's rows lie a multiple of 4 KiB apart: then this
 * launch mixes in bursts (bursts "auto"). */
static int rows_alias(const struct attnres_cpu_mix_args *a)
{
    for (int i = 0; i < a->n; i++)
        if (a->src_stride[i] * (int64_t)sizeof(storage_t) % 4096 != 0)
            return 0;
    return 1;
}
]]

-- A switch that calls sweep() with a constant group size, with and
-- without the mix, so each case compiles to register-resident code. The
-- mix alone (g = 0) takes mix_fixed() with a constant n where it applies.
-- Each case is a whole copy of the sweep, and the copies were most of a
-- compile (about 1.2 s of gcc -O3 each on the Zen 4 guest): a source
-- specialized for one n (T.specialize) has the cases that n reaches and a
-- general one (a runtime g) for every other n.
local function dispatch(p, facts)
  local n = facts and facts.n
  -- The group sizes token rows of n split into (stats_and_mix()).
  local reached = {}
  if n then
    local sweeps = (n + p.group - 1) // p.group
    reached[n // sweeps] = true
    reached[(n + sweeps - 1) // sweeps] = true
  end
  local function cases(mix)
    local text = gen.each(p.group + 1, function(i)
      local g = i - 1
      if g == 0 and not mix then return "" end
      if g == 0 and mix_fixed_applies(p) then
        return gen.subst([[
        case 0:
            switch (${N}) {
${fixed}            default: sweep(a, q, cur, weight, partial, partial_next, out, keep, sq, 0, rows, next, ss_out, dp_out, ahead, n_ahead); break;
            }
            break;
]], { N = p.burst == "auto" and "q->bursts ? 0 : a->n" or "a->n",
        fixed = gen.each(MIX_FIXED_MAX, function(m)
          if n and m ~= n then return "" end
          return string.format("            case %d: mix_fixed(a, cur, weight, partial, partial_next, out, keep, sq, ahead, n_ahead, %d); break;\n", m, m)
        end) })
      end
      if n and g > 0 and not reached[g] then return "" end
      return string.format(
        "        case %d: sweep(a, q, %s, g, rows, next, ss_out, dp_out, ahead, n_ahead); break;\n", g,
        mix and "cur, weight, partial, partial_next, out, keep, sq"
            or "NULL, NULL, NULL, 0, NULL, NULL, NULL")
    end)
    if n and mix then
      -- Another group size: the mix alone (case 0), then its statistics.
      text = text .. [[
        default:
            sweep_group(a, q, cur, weight, partial, partial_next, out, keep, sq, 0, NULL, NULL, NULL, NULL, NULL, 0);
            sweep_group(a, q, NULL, NULL, NULL, 0, NULL, NULL, NULL, g, rows, next, ss_out, dp_out, ahead, n_ahead);
            break;
]]
    elseif n then
      -- Another group size: its statistics a row at a time.
      text = text .. [[
        default:
            for (int j = 0; j < g; j++)
                sweep(a, q, NULL, NULL, NULL, 0, NULL, NULL, NULL, 1, rows + j, next ? next + j : NULL, ss_out + j,
                      dp_out + (int64_t)j * a->heads, j + 1 < g ? rows + j + 1 : ahead, j + 1 < g ? 1 : n_ahead);
            break;
]]
    end
    return text
  end
  return gen.subst([[
/* sweep() for a group of g <= ${G} rows; cur == NULL skips the mix. */
static void sweep_group(const struct attnres_cpu_mix_args *a, const struct query_forms *q,
                        const storage_t *const *cur, const float *weight,
                        const storage_t *partial, int64_t partial_next, storage_t *out,
                        float *keep, vf *sq, int g, const storage_t *const *rows,
                        const int64_t *next, float *ss_out, float *dp_out,
                        const storage_t *const *ahead, int n_ahead)
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

function T.emit(p, facts)
  local name = space.kernel_name(source_id(p))
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = gen.subst([[
${helpers}${pairs}
${softmax}
${dot_helpers}${stream}
/* The query as the statistics read it: in pair order (fp32), and for the
 * bf16 dot products as high and low bf16 halves in row order. */
struct query_forms {
    const float *pair;
    const uint16_t *hi, *lo;
${bursts_field}};
${rows_alias}
${sweep}
${mix_fixed}${dispatch}
/* The statistics of token t's n rows, in sweeps of at most ${G} rows sized
 * evenly (9 rows: 5 + 4), ${mix_where}
 * when given. Leaves each row's score scale * dot / rms in
 * score[i * heads + h]. `more` says token t + 1 is in the launch's range,
 * for the prefetches that reach a token ahead. */
static void stats_and_mix(const struct attnres_cpu_mix_args *a, const struct query_forms *q,
                          int64_t t, int more, const storage_t *const *cur,
                          const float *weight, const storage_t *partial, storage_t *out,
                          float *keep, vf *sq, float *score)
{
    const int n = a->n, heads = a->heads;
    const storage_t *rows[n];
    int64_t next[n];
    float ss[n];
    for (int i = 0; i < n; i++) {
        rows[i] = (const storage_t *)a->src[i] + t * a->src_stride[i];
        next[i] = a->src_stride[i];
    }
    const int sweeps = (n + ${G} - 1) / ${G};
${mix_apart}    for (int s = 0, i0 = 0; s < sweeps; s++) {
        const int g = n / sweeps + (s < n % sweeps);
        /* The rows the next sweep reads first: the next group's. */
        const int g_next = s + 1 < sweeps ? n / sweeps + (s + 1 < n % sweeps) : 0;
        sweep_group(a, q, ${sweep_cur}, weight, partial, a->partial_stride, out, keep,
                    sq, g, rows + i0, more ? next + i0 : NULL, ss + i0, score + i0 * heads,
                    rows + i0 + g, g_next);
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
      softmax = rowops.depth_softmax(p.vec),
      sweep = sweep(p),
      mix_fixed = mix_fixed(p),
      dispatch = dispatch(p, facts),
      dot_helpers = dot_helpers(p),
      stream = p.store == "stream" and storage.stream_helpers(p.vec, true) or "",
      G = p.group,
      mix_where = p.mix == "fused" and "the first of which also mixes `cur` (token t - 1)"
          or "after a sweep that mixes `cur` (token t - 1) alone",
      mix_apart = p.mix == "fused" and ""
          or "    if (cur) /* prefetching the first group's rows */\n" ..
             "        sweep_group(a, q, cur, weight, partial, a->partial_stride, out, keep, sq, 0,\n" ..
             "                    NULL, NULL, NULL, NULL, rows, n / sweeps + (0 < n % sweeps));\n",
      sweep_cur = p.mix == "fused" and "s == 0 ? cur : NULL" or "NULL",
      bursts_field = p.burst == "auto"
          and "    int bursts; /* bursts \"auto\": whether this launch runs in bursts */\n" or "",
      rows_alias = p.burst == "auto" and ROWS_ALIAS or "",
    }),
    name = name,
    abi = "cpu_mix",
    body = gen.subst([[
    const int64_t d = a->d;
    const int n = a->n, heads = a->heads;
    float qp[d], keep[d], gp[d], score[n * heads], weight[n * heads];
${split_decl}    const storage_t *cur[n];
    if (t0 >= t1)
        return; /* the first sweep below would read token t0 */
${query_forms}    if (a->normed)
        pair_order(a->out_gain, gp, d);
    /* Token t0's scores; then each sweep mixes t and scores t + 1. */
    stats_and_mix(a, &q, t0, t0 + 1 < t1, NULL, NULL, NULL, NULL, NULL, NULL, score);
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
            stats_and_mix(a, &q, t + 1, t + 2 < t1, cur, weight, partial, out, kept, &sq, score);
        else
            sweep_group(a, &q, cur, weight, partial, 0, out, kept, &sq, 0, NULL, NULL, NULL, NULL, NULL, 0);
        if (normed) {
            /* keep holds the output in pair order; so does gp. */
            const float rs = 1.0f / sqrtf(hsum(sq) / (float)d + a->out_eps);
            for (int64_t k = 0; k < d; k += 2 * ${VEC}) {
                const vf lo = load_f32(keep + k) * rs * load_f32(gp + k);
                const vf hi = load_f32(keep + k + ${VEC}) * rs * load_f32(gp + k + ${VEC});
${store_normed}            }
        }
    }
${fence}]], { VEC = p.vec,
         store_normed = store_pair_text(p, "normed + k", "lo", "hi", "                "),
         fence = p.store == "stream" and "    stream_fence();\n" or "",
         split_decl = p.dot == "bf16"
             and "    uint16_t qhi[d], qlo[d];\n    const struct query_forms q = {qp, qhi, qlo};\n"
             or p.burst == "auto" and "    const struct query_forms q = {qp, NULL, NULL, rows_alias(a)};\n"
             or "    const struct query_forms q = {qp, NULL, NULL};\n",
         -- The bf16 dot products read the split query alone; their FMA
         -- stand-in (a compiler without AVX512-BF16) the pair-ordered one.
         query_forms = p.dot == "bf16"
             and "#if defined(__AVX512BF16__)\n    split_query(a->query, qhi, qlo, d);\n#else\n" ..
                 "    pair_order(a->query, qp, d);\n#endif\n"
             or "    pair_order(a->query, qp, d);\n" }),
  }
  return src, name
end

return T
