-- cpu/phase1.lua: phase 1 of Block AttnRes (DESIGN §1, two-phase form) as C
-- for the CPU backend: the S pseudo-queries of one block against its n
-- completed block representations, batched.
--
-- Per token, each source row is swept once for its RMS statistic r_i and the
-- first query's dot products (the row then sits in cache), r_i is shared by
-- all S queries, and the S x H depth softmaxes run over those scores. Site j
-- gets its normalised mix o1_j and lse_j = m + log(l) per head (fp32).
--
-- Parameters and why they matter:
--   schedule  how the mixing sweep is ordered. "siteouter": for each site,
--             sum the n rows column block by column block, keeping the sum
--             in registers (each block of the n rows is re-read from L1 for
--             every site). "sourceouter": for each column block, load each
--             source's lanes once and fold them into all S sites' sums (the
--             S sums live in a small stack array). "tiled": per group of
--             sites (6 for 16 lanes, 3 below), one pass along the row with
--             a register tile of the group's sums over 4 vectors of
--             columns, into which the n rows' lanes are folded; each row's
--             lanes are loaded once per group, and each site's o1 row is
--             written whole lines at a time (see mix_tiled).
--   stream    1 (tiled schedule only): o1 rows are stored past the caches,
--             four vectors at a time (two in a head's last steps), so each
--             row gets whole lines in turn.
--             They are S times the rows read, written once and read back
--             only by a later phase 2, so at larger T ordinary stores spend
--             as much again reading each line in before writing it.
--   scores    how the n x S score dot products are taken. "persite": one
--             pass over the row per site (the row stays in L1, but the
--             S x d fp32 queries stream from L2 once per row). "tiled":
--             register tiles of rows x sites (4 x 6 for 16 lanes, 2 x 4
--             below), where each row vector loaded serves every site of the
--             tile and each query vector every row, so the queries stream
--             once per 4 (or 2) rows.
--   vec       fp32 lanes per vector (1 = scalar code, 8 = AVX2, 16 = AVX-512).
--   unroll    independent accumulators per loop, to hide FMA latency.
--   threads   the most worker threads the launch spreads tokens over: a
--             launch parameter, not part of the source (lib/cpu_space.lua).
-- The kernel entry processes tokens [t0, t1); the runtime splits T.
--
-- Numerics: fp32 reductions, the running max starts at -1e30f (never -inf),
-- 64-bit offsets; NaN in one token's source row reaches only that token.

local template = require("lib/template")
local storage = require("lib/c_storage")
local space = require("lib/cpu_space")
local kernel = require("lib/c_kernel")
local rowops = require("lib/c_rowops")

local T = template.new("cpu", "phase1", {
  { name = "schedule", values = { "siteouter", "sourceouter", "tiled" } },
  { name = "scores", values = { "persite", "tiled" } },
  { name = "stream", values = { 0, 1 } },
  { name = "vec", values = { 1, 8, 16 } },
  { name = "unroll", values = { 1, 2, 4 } },
  space.threads, -- 1, 2, 4, ... 64, set at launch (lib/cpu_space.lua)
}, {
  -- The runtime's built-in fallback: scalar code that fits every d, H and S,
  -- spread over all cores.
  generic = { schedule = "siteouter", scores = "persite", stream = 0, vec = 1, unroll = 1, threads = 64 },
  -- The built-in kernels per ISA level (see cpu/mix_fused.lua).
  builtin = {
    avx512 = { schedule = "tiled", scores = "tiled", stream = 0, vec = 16, unroll = 1, threads = 64 },
    avx2 = { schedule = "tiled", scores = "tiled", stream = 0, vec = 8, unroll = 1, threads = 64 },
    sse2 = { schedule = "tiled", scores = "tiled", stream = 0, vec = 8, unroll = 1, threads = 64 },
    neon = { schedule = "tiled", scores = "tiled", stream = 0, vec = 8, unroll = 1, threads = 64 },
  },
})

-- AVX512-BF16 CPUs: the AVX-512 variant, compiled with it (see cpu/mix_fused.lua).
T.builtin.avx512bf16 = T.builtin.avx512

-- Per-token scratch the kernel keeps on the stack (softmax weights); must
-- agree with AR_CPU_PHASE1_MAX_WEIGHTS in runtime/src/cpu_phase_abi.h.
local MAX_WEIGHTS = 1 << 15
local MAX_SUMS = 1 << 14

-- Tiles take their own accumulators: unrolling them further is the same
-- code, and scalar tiles gain nothing.
function T.constraint(p)
  local tiled = p.scores == "tiled" or p.schedule == "tiled"
  return space.constraint(p) and not (tiled and (p.unroll ~= 1 or p.vec == 1)) and
         not (p.stream == 1 and p.schedule ~= "tiled")
end

-- The id of a variant's source: its id without the thread count.
local function source_id(p)
  return string.format("phase1_c_%s_%s_%s%s_v%d_u%d", p.dtype, p.schedule, p.scores,
                       p.stream == 1 and "_nt" or "", p.vec, p.unroll)
end

space.entries(T, "cpu_phase1", source_id)

-- A loop step: two vectors when streaming, so the head width must hold them.
function T.step(p)
  return p.stream == 1 and 2 * p.vec or p.vec * p.unroll
end

function T.applies(p, problem, device)
  local ok, why = space.applies(T, p, problem, device)
  if not ok then return false, why end
  if (problem.s or 0) < 1 then return false, "phase1 needs S >= 1 sites" end
  if problem.n * problem.s * problem.heads > MAX_WEIGHTS then
    return false, string.format("n*S*H = %d softmax weights exceed the %d a launch keeps on the stack",
                                problem.n * problem.s * problem.heads, MAX_WEIGHTS)
  end
  -- sourceouter keeps S * vec * unroll fp32 sums on the stack: at most 64 KiB.
  if p.schedule == "sourceouter" and problem.s * p.vec * p.unroll > MAX_SUMS then
    return false, string.format("S*vec*unroll = %d sums exceed the %d sourceouter keeps on the stack",
                                problem.s * p.vec * p.unroll, MAX_SUMS)
  end
  return true
end

-- The mixing sweep of one token: every site's o1 from the n rows and the
-- probabilities in weight[(i * sites + j) * heads + h].
local function mix_siteouter(p)
  local u = p.unroll
  return gen.subst([[
        /* Each site's sum over the n rows, column block by column block,
         * in registers; the block's rows stay in L1 across sites. */
        for (int j = 0; j < sites; j++) {
            storage_t *o = (storage_t *)a->o1[j] + t * a->o1_stride;
            for (int h = 0; h < heads; h++) {
                const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
                for (int64_t kb = k0; kb < k1; kb += ${STEP}) {
${zero}
                    for (int i = 0; i < n; i++) {
                        const float w = weight[((int64_t)i * sites + j) * heads + h];
${accumulate}
                    }
${store}
                }
            }
        }]], {
    STEP = p.vec * u,
    zero = gen.each(u, function(i) return string.format("                    vf o%d = {0};", i - 1) end, "\n"),
    accumulate = gen.each(u, function(i)
      return string.format("                        o%d += w * load_row(rows[i] + kb + %d);", i - 1, (i - 1) * p.vec)
    end, "\n"),
    store = gen.each(u, function(i)
      return string.format("                    store_row(o + kb + %d, o%d);", (i - 1) * p.vec, i - 1)
    end, "\n"),
  })
end

local function mix_sourceouter(p)
  local u = p.unroll
  return gen.subst([[
        /* Per column block, each source's lanes are loaded once and folded
         * into every site's sum (sums[j * ${U} + lane]). */
        for (int h = 0; h < heads; h++) {
            const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
            for (int64_t kb = k0; kb < k1; kb += ${STEP}) {
                for (int j = 0; j < sites * ${U}; j++)
                    sums[j] = (vf){0};
                for (int i = 0; i < n; i++) {
${load}
                    const float *wi = weight + (int64_t)i * sites * heads + h;
                    for (int j = 0; j < sites; j++) {
                        const float w = wi[(int64_t)j * heads];
${accumulate}
                    }
                }
                for (int j = 0; j < sites; j++) {
                    storage_t *o = (storage_t *)a->o1[j] + t * a->o1_stride;
${store}
                }
            }
        }]], {
    U = u,
    STEP = p.vec * u,
    load = gen.each(u, function(i)
      return string.format("                    const vf x%d = load_row(rows[i] + kb + %d);", i - 1, (i - 1) * p.vec)
    end, "\n"),
    accumulate = gen.each(u, function(i)
      return string.format("                        sums[j * %d + %d] += w * x%d;", u, i - 1, i - 1)
    end, "\n"),
    store = gen.each(u, function(i)
      return string.format("                    store_row(o + kb + %d, sums[j * %d + %d]);", (i - 1) * p.vec, u, i - 1)
    end, "\n"),
  })
end

-- The tiled score dot products (scores = "tiled"): a function that fills
-- weight[(i * sites + j) * heads + h] with row i's dot product with query
-- j per head, RB rows by SB sites at a time.
local function tiled_dots(p)
  local rb, sb = 2, 4
  if p.vec == 16 then rb, sb = 4, 6 end
  return gen.subst([[
/* Dot products of the n rows with the S queries, per head, in register
 * tiles of ${RB} rows x ${SB} sites. Tiles at the edges repeat the last row
 * or site and drop those results. */
static void tiled_dots(const storage_t *const *rows, const float *queries, int n, int sites,
                       int64_t d, int heads, float *out)
{
    const int64_t hd = d / heads;
    for (int i0 = 0; i0 < n; i0 += ${RB})
        for (int j0 = 0; j0 < sites; j0 += ${SB}) {
            const storage_t *r[${RB}];
            const float *q[${SB}];
            for (int a = 0; a < ${RB}; a++)
                r[a] = rows[i0 + a < n ? i0 + a : n - 1];
            for (int b = 0; b < ${SB}; b++)
                q[b] = queries + (int64_t)(j0 + b < sites ? j0 + b : sites - 1) * d;
            for (int h = 0; h < heads; h++) {
                vf acc[${RB}][${SB}];
#pragma GCC unroll ${RB}
                for (int a = 0; a < ${RB}; a++)
#pragma GCC unroll ${SB}
                    for (int b = 0; b < ${SB}; b++)
                        acc[a][b] = (vf){0};
                for (int64_t k = (int64_t)h * hd; k < (int64_t)(h + 1) * hd; k += ${VEC}) {
                    vf x[${RB}];
#pragma GCC unroll ${RB}
                    for (int a = 0; a < ${RB}; a++)
                        x[a] = load_row(r[a] + k);
#pragma GCC unroll ${SB}
                    for (int b = 0; b < ${SB}; b++) {
                        const vf qv = load_f32(q[b] + k);
#pragma GCC unroll ${RB}
                        for (int a = 0; a < ${RB}; a++)
                            acc[a][b] += x[a] * qv;
                    }
                }
                /* The tile's lanes summed all at once (lib/c_storage.lua):
                 * with 8 heads, 3% faster than one vector at a time. */
                float sum[${RB} * ${SB}];
                lane_sums(&acc[0][0], ${RB} * ${SB}, sum);
                for (int a = 0; a < ${RB} && i0 + a < n; a++)
                    for (int b = 0; b < ${SB} && j0 + b < sites; b++)
                        out[((int64_t)(i0 + a) * sites + j0 + b) * heads + h] = sum[a * ${SB} + b];
            }
        }
}
]], { RB = rb, SB = sb, VEC = p.vec })
end

-- The score loop of one token: every row's r and its scaled dot products
-- with every site's query, into weight[(i * sites + j) * heads + h].
local function scores(p)
  if p.scores == "tiled" then
    return [[
        /* Scores: row sums of squares, then all dot products in tiles. */
        float r[n];
        for (int i = 0; i < n; i++) {
            rows[i] = (const storage_t *)a->src[i] + t * a->src_stride[i];
            r[i] = 1.0f / sqrtf(row_stats(rows[i], a->queries, hd, heads, dot) * inv_d + eps);
        }
        tiled_dots(rows, a->queries, n, sites, d, heads, weight);
        for (int i = 0; i < n; i++)
            for (int64_t j = 0; j < (int64_t)sites * heads; j++)
                weight[(int64_t)i * sites * heads + j] *= scale * r[i];]]
  end
  return [[
        /* Scores: each row is read from memory once; its r serves all sites. */
        for (int i = 0; i < n; i++) {
            rows[i] = (const storage_t *)a->src[i] + t * a->src_stride[i];
            float *wi = weight + (int64_t)i * sites * heads;
            const float r = 1.0f / sqrtf(row_stats(rows[i], a->queries, hd, heads, dot) * inv_d + eps);
            for (int h = 0; h < heads; h++)
                wi[h] = scale * r * dot[h];
            for (int j = 1; j < sites; j++) {
                const float *q = a->queries + (int64_t)j * d;
                for (int h = 0; h < heads; h++)
                    wi[(int64_t)j * heads + h] = scale * r * head_dot(rows[i], q, (int64_t)h * hd, hd);
            }
        }]]
end

-- Sites per group and vectors per step of the tiled mix: a register tile
-- of sites x columns. 16 lanes (32 registers): 6 sites x 4 vectors, 24
-- sums; 8 lanes (AVX2's 16): 3 x 4, 12.
local MIX_TILE = { [16] = { sites = 6, vecs = 4 }, [8] = { sites = 3, vecs = 4 } }

-- The tiled mix: for a group of sites, one pass along the row, each step
-- the group's sums over `vecs` vectors of columns in registers while the n
-- rows' lanes are folded in, then stored. Why this order and this tile: S
-- output rows are written per token (24 of K3's 14 KiB rows against 8
-- read), and a schedule that stored one vector of every site per column
-- block kept 24 rows' partial lines in flight; on the Zen 4 guest its mix
-- took twice as long with the stores as without them. A group's few rows,
-- each written several vectors (whole lines) at a time, cost little more
-- than the arithmetic (docs/cpu_kernels.md).
local function mix_tiled(p)
  local tile = MIX_TILE[p.vec]
  -- Streaming stores need whole lines: the last steps go by two vectors.
  local tail = p.stream == 1 and 2 or 1
  local function step(w, indent)
    return (gen.indent(gen.subst([==[
vf acc[${W}][${SB}];
#pragma GCC unroll ${W}
for (int c = 0; c < ${W}; c++)
#pragma GCC unroll ${SB}
    for (int b = 0; b < ${SB}; b++)
        acc[c][b] = (vf){0};
for (int i = 0; i < n; i++) {
    const float *wi = weight + (int64_t)i * sites * heads;
#pragma GCC unroll ${W}
    for (int c = 0; c < ${W}; c++) {
        const vf x = load_row(rows[i] + kb + c * ${VEC});
#pragma GCC unroll ${SB}
        for (int b = 0; b < ${SB}; b++)
            acc[c][b] += wi[wj[b]] * x;
    }
}
#pragma GCC unroll ${SB}
for (int b = 0; b < ${SB}; b++)
    if (j0 + b < sites)
#pragma GCC unroll ${W}
        for (int c = 0; c < ${W}; c++)
            ${STORE}(orow[b] + kb + c * ${VEC}, acc[c][b]);
]==], { W = w, SB = tile.sites, VEC = p.vec,
        STORE = p.stream == 1 and "stream_row" or "store_row" }), indent):gsub("\n +#", "\n#"))
  end
  return gen.subst([==[
        /* Per group of ${SB} sites, one pass along each head's columns: the
         * group's sums over ${W} vectors of columns in registers while the
         * n rows' lanes are folded in, then stored, whole lines to each of
         * the group's rows. A group at the edge repeats the last site's
         * weights and drops those sums. */
        for (int h = 0; h < heads; h++) {
            const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
            for (int j0 = 0; j0 < sites; j0 += ${SB}) {
                int64_t wj[${SB}];
                storage_t *orow[${SB}];
                for (int b = 0; b < ${SB}; b++) {
                    const int j = j0 + b < sites ? j0 + b : sites - 1;
                    wj[b] = (int64_t)j * heads + h;
                    orow[b] = (storage_t *)a->o1[j] + t * a->o1_stride;
                }
                int64_t kb = k0;
                for (; kb + ${STEP} <= k1; kb += ${STEP}) {
${whole}                }
                for (; kb < k1; kb += ${TAIL_STEP}) {
${tail}                }
            }
        }]==], { SB = tile.sites, W = tile.vecs, STEP = tile.vecs * p.vec,
                 TAIL_STEP = tail * p.vec,
                 whole = step(tile.vecs, 20), tail = step(tail, 20) })
end

function T.emit(p)
  local name = space.kernel_name(source_id(p))
  local sweep = ({ siteouter = mix_siteouter, sourceouter = mix_sourceouter,
                   tiled = mix_tiled })[p.schedule](p)
  local vars = {
    helpers = storage.helpers(p.dtype, p.vec),
    row_stats = rowops.row_stats(p),
    head_dot = p.scores == "persite" and rowops.head_dot(p) or "",
    tiled = p.scores == "tiled" and (storage.lane_sums(p.vec) .. tiled_dots(p)) or "",
    scores = scores(p),
    stream = p.stream == 0 and "" or storage.stream_helpers(p.vec),
    fence = p.stream == 0 and "" or [[

    /* Streaming stores are weakly ordered: make them visible before the
     * launch reports completion. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);]],
    SUMS = p.schedule == "sourceouter" and ("sites * " .. p.unroll) or "1",
    sweep = sweep,
  }
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = gen.subst([[
${helpers}
${row_stats}
${head_dot}
${tiled}${stream}]], vars),
    name = name,
    abi = "cpu_phase1",
    -- With GCC 12's -march=native on the Zen 4 guest (tuning for znver3), the
    -- tiled loops' pointers overflowed the general registers into vector
    -- ones, each reload a vmovq on the path to a load. Scheduled for a
    -- generic x86-64, as the built-in kernels are compiled, the same
    -- variants ran 4-25% faster in interleaved rounds, and the tuned winners
    -- went from 0.55-0.89 of the built-ins' speed to 1.00-1.08
    -- (bench/results/ceilings-2026-12-04.md). The mix kernels showed no such
    -- difference, so they keep the CPU's own tuning.
    tune = "generic",
    body = gen.subst([[
    const int64_t d = a->d;
    const int n = a->n, heads = a->heads, sites = a->s;
    const int64_t hd = d / heads;
    const float inv_d = 1.0f / (float)d, eps = a->eps, scale = a->scale;
    float dot[heads];
    float weight[(int64_t)n * sites * heads];
    const storage_t *rows[n];
    vf sums[${SUMS}];
    (void)sums;
    for (int64_t t = t0; t < t1; t++) {
${scores}
        /* One depth softmax per site and head; weights become probabilities. */
        for (int j = 0; j < sites; j++) {
            float *lse = a->lse[j] + t * a->lse_stride;
            for (int h = 0; h < heads; h++) {
                float *w = weight + (int64_t)j * heads + h;
                const int64_t step = (int64_t)sites * heads;
                float m = -1e30f, l = 0.0f;
                for (int i = 0; i < n; i++)
                    m = fmaxf(m, w[i * step]);
                for (int i = 0; i < n; i++) {
                    const float e = expf(w[i * step] - m);
                    w[i * step] = e;
                    l += e;
                }
                const float inv = 1.0f / l;
                for (int i = 0; i < n; i++)
                    w[i * step] *= inv;
                lse[h] = m + logf(l);
            }
        }
${sweep}
    }${fence}
]], vars),
  }
  return src, name
end

return T
