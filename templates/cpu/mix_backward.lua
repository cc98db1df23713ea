-- cpu/mix_backward.lua: the backward of the mix (DESIGN §1b) as C for the
-- CPU backend, replace and additive forms, any H.
--
-- Per token, with gm = alpha * dout (alpha = 1 in the replace form):
--   sweep 1, each source row from memory once: its sum of squares, and per
--            head its dot q with the query u and its dot p' with dout;
--   then     r, the scores and the softmax weights a per head (recomputed:
--            the forward saves nothing), delta' = sum_n a p' per head, and
--            the score gradients dz = a * alpha * (p' - delta'), which are
--            exactly zero for N = 1 (a = 1, and p' - 1 * p' is 0);
--            c_n = sum_h dz q;
--   sweep 2, over the same rows, now in cache: the source gradients
--            dv = a gm + scale r (dz u - v r^2 c / d), written or added
--            into the caller's buffer (storage type, or fp32 when the
--            runtime sets dsrc_f32), and the token's share of du,
--            scale dz r v, added into its token group's fp32 row of the
--            workspace.
-- In the additive form d(partial) = dout, written or added the same way,
-- and the token's share of d(alpha), sum_h delta', goes to its group's
-- slot. Reading dout's dot per source in sweep 1 (p') instead of taking
-- delta from the forward's out keeps N = 1 exact and needs no out.
--
-- With the output-norm epilogue (normed = RMSNorm(out) * gain, the forward's
-- second output) a token first makes its gradient of out, do = dout + the
-- RMSNorm backward of dnormed, from the out row the caller kept (one more
-- row read, and dnormed's), in fp32 on the stack, where the sweeps then read
-- it instead of dout; its share of d(gain) goes to its group's row of the
-- workspace as du's does. The token loop is one inline function compiled
-- twice, with and without the epilogue, so the plain path pays nothing.
--
-- Determinism: the runtime starts every launch on the first token of a
-- group (of a->group tokens, a size fixed by the runtime for every kernel
-- and thread count), a group's tokens run in order on one thread, and the
-- runtime adds the groups' rows in group order after the launch. So du and
-- d(alpha) do not depend on how tokens are spread over threads.
--
-- Parameters and why they matter:
--   vec       fp32 lanes per vector (1 = scalar code, 8 = AVX2, 16 = AVX-512).
--   unroll    independent accumulators per loop in sweep 1, to hide FMA
--             latency (three reductions per row share each load).
--   layout    "rows": each vector holds consecutive elements of a row.
--             "pairs" (bf16 rows in vectors): a step widens 2 * vec
--             elements into their even and odd elements with two integer
--             operations, and narrows them back with one store
--             (lib/c_storage.lua's pair helpers), where widening and
--             narrowing by rows take shuffles: sweep 2's loop is about 33
--             instructions a 16 elements instead of 60 (AVX2). The query
--             and the group's du are then kept in pair order on the stack
--             (8 d bytes), du going to the workspace in row order at the
--             group's end. Each of the unroll steps is a pair.
--   store     "stream" (vectors only): fresh gradients in the storage type
--             go past the caches (lib/c_storage.lua's stream_row and
--             stream_pair), which saves reading each line before writing
--             it; "cached": plain stores, for gradients that the caller
--             reads again soon.
--   threads   the most worker threads the launch spreads token groups
--             over: a launch parameter, not part of the source
--             (lib/cpu_space.lua).
--
-- In vectors, in either layout, sweep 2 also prefetches the next token's
-- rows (into L2) at the offsets it works on, so that the next sweep 1 reads
-- them from cache while this token's arithmetic runs: 17.8 to 19.4 GB/s for
-- bf16 pairs, 18.1 to 19.9 for f16 rows at K3's shape on a Zen 3 guest
-- (bench/results/backward-pairs-2026-12-06.md).
--
-- Numerics: fp32 arithmetic throughout, the storage type only at loads
-- and stores; 64-bit offsets.

local template = require("lib/template")
local storage = require("lib/c_storage")
local space = require("lib/cpu_space")
local kernel = require("lib/c_kernel")
local rowops = require("lib/c_rowops")

local T = template.new("cpu", "mix_backward", {
  { name = "vec", values = { 1, 8, 16 } },
  { name = "unroll", values = { 1, 2 } },
  { name = "layout", values = { "rows", "pairs" } },
  { name = "store", values = { "cached", "stream" } },
  space.threads, -- 1, 2, 4, ... 64, set at launch (lib/cpu_space.lua)
}, {
  -- The runtime's built-in fallback: scalar code that fits every d and H,
  -- spread over all cores.
  generic = { vec = 1, unroll = 1, layout = "rows", store = "cached", threads = 64 },
  -- The built-in kernels per ISA level (runtime/cpu_builtin.cmake), which a
  -- plan without a database takes before the generic one. One register of
  -- lanes where the level has 8 or 16; two accumulators per reduction where
  -- the registers hold six of them with room to spare (32 zmm, 16 ymm), so
  -- that sweep 1 waits on memory rather than on FMA latency. SSE2 and NEON
  -- take 8 lanes as two registers, once, as the forward built-ins do; their
  -- step of 8 also fits the most head widths.
  builtin = {
    avx512 = { vec = 16, unroll = 2, layout = "rows", store = "cached", threads = 64 },
    -- AVX2's bf16: pairs, of the same step of 16 as two vectors of rows,
    -- with streamed gradients: the tuned winner at K3's and MHAR-8B's
    -- shapes on a Zen 3 guest, 1.6-1.7x the rows' rate
    -- (bench/results/backward-pairs-2026-12-06.md).
    -- Every AVX2 built-in streams its gradients: 1.2-1.3x the cached
    -- stores' rate for f32 and f16 at K3's shape on the same host.
    avx2 = { vec = 8, unroll = 2, layout = "rows", store = "stream", threads = 64,
             bf16 = { unroll = 1, layout = "pairs" } },
    sse2 = { vec = 8, unroll = 1, layout = "rows", store = "cached", threads = 64 },
    neon = { vec = 8, unroll = 1, layout = "rows", store = "cached", threads = 64 },
  },
})

-- AVX512-BF16 CPUs: the AVX-512 variant, compiled with it (see cpu/mix_fused.lua).
T.builtin.avx512bf16 = T.builtin.avx512

-- The pair layout pays only where widening and narrowing cost shuffles,
-- that is for bf16 rows in vectors.
function T.constraint(p)
  return space.constraint(p) and (p.layout == "rows" or (p.dtype == "bf16" and p.vec > 1))
      and (p.store == "cached" or p.vec > 1)
end

-- One step of sweep 1 covers unroll vectors, or unroll pairs of them.
function T.step(p)
  return p.vec * p.unroll * (p.layout == "pairs" and 2 or 1)
end

local function source_id(p)
  return string.format("mix_backward_c_%s_v%d_u%d%s%s", p.dtype, p.vec, p.unroll,
                       p.layout == "pairs" and "_pr" or "", p.store == "stream" and "_ss" or "")
end

space.entries(T, "cpu_mix_backward", source_id)

-- Sweep 1's step in the row layout: unroll vectors, three reductions
-- sharing each load.
local function sweep1_rows(p)
  return gen.each(p.unroll, function(i)
    return gen.subst([[
                    const vf x${J} = load_row(row + k + ${OFF});
                    ss${J} += x${J} * x${J};
                    dq${J} += x${J} * load_f32(query + k + ${OFF});
                    dp${J} += x${J} * load_go(go, gof, k + ${OFF}, epi);]], { J = i - 1, OFF = (i - 1) * p.vec })
  end, "\n")
end

-- Sweep 1's step in the pair layout: unroll pairs, each half its own
-- accumulator, against the pair-ordered query.
local function sweep1_pairs(p)
  return gen.each(p.unroll, function(i)
    local j, off = i - 1, (i - 1) * 2 * p.vec
    return gen.subst([[
                    vf xl${J}, xh${J}, gl${J}, gh${J};
                    load_pair(row + k + ${OFF}, &xl${J}, &xh${J});
                    load_go_pair(go, gof, k + ${OFF}, epi, &gl${J}, &gh${J});
                    ss${L} += xl${J} * xl${J};
                    ss${H} += xh${J} * xh${J};
                    dq${L} += xl${J} * load_f32(query + k + ${OFF});
                    dq${H} += xh${J} * load_f32(query + k + ${OFF} + ${VEC});
                    dp${L} += xl${J} * gl${J};
                    dp${H} += xh${J} * gh${J};]],
      { J = j, L = 2 * j, H = 2 * j + 1, OFF = off, VEC = p.vec })
  end, "\n")
end

-- Where sweep 2 writes a source gradient y, one of four loops (fp32 or
-- storage rows, written or added) chosen once per row, not per vector.
local gradient_stores = {
  { cond = "f32 && acc", rows = "store_f32(dvf + k, y + load_f32(dvf + k));",
    pairs = "vf al, ah;\n${I}load_pair_f32(dvf + k, &al, &ah);\n${I}store_pair_f32(dvf + k, yl + al, yh + ah);" },
  { cond = "f32", rows = "store_f32(dvf + k, y);", pairs = "store_pair_f32(dvf + k, yl, yh);" },
  { cond = "acc", rows = "store_row(dv + k, y + load_row(dv + k));",
    pairs = "vf al, ah;\n${I}load_pair(dv + k, &al, &ah);\n${I}store_pair(dv + k, yl + al, yh + ah);" },
  { cond = nil, rows = "${STORE_ROW}(dv + k, y);", pairs = "${STORE_PAIR}(dv + k, yl, yh);" },
}

-- Sweep 2 over one head of one source: the gradient row and the token's
-- share of du (dv = wa dout + zu u - xr v: three multiply-adds a vector).
local function sweep2(p)
  local I = "                        "
  local loops = {}
  for n, s in ipairs(gradient_stores) do
    local body
    if p.layout == "pairs" then
      body = gen.subst([[
                    for (int64_t k = k0; k < k1; k += ${STEP}) {
                        vf xl, xh, gl, gh;
                        __builtin_prefetch(next + k, 0, 2);
                        load_pair(row + k, &xl, &xh);
                        load_go_pair(go, gof, k, epi, &gl, &gh);
                        const vf yl = wa * gl + zu * load_f32(query + k) - xr * xl;
                        const vf yh = wa * gh + zu * load_f32(query + k + ${VEC}) - xr * xh;
${I}${STORE}
                        store_f32(du + k, load_f32(du + k) + zr * xl);
                        store_f32(du + k + ${VEC}, load_f32(du + k + ${VEC}) + zr * xh);
                    }]], { STEP = 2 * p.vec, VEC = p.vec, I = I,
          STORE = gen.subst(s.pairs, { I = I, STORE_PAIR = p.store == "stream" and "stream_pair" or "store_pair" }) })
    else
      body = gen.subst([[
                    for (int64_t k = k0; k < k1; k += ${VEC}) {
${PREFETCH}                        const vf x = load_row(row + k);
                        const vf y = wa * load_go(go, gof, k, epi) + zu * load_f32(query + k) - xr * x;
${I}${STORE}
                        store_f32(du + k, load_f32(du + k) + zr * x);
                    }]], { VEC = p.vec, I = I,
          STORE = gen.subst(s.rows, { STORE_ROW = p.store == "stream" and "stream_row" or "store_row" }),
          PREFETCH = p.vec > 1 and "                        __builtin_prefetch(next + k, 0, 2);\n" or "" })
    end
    local head = s.cond and string.format("%sif (%s)", n == 1 and "" or "else ", s.cond) or "else"
    loops[#loops + 1] = "                " .. head .. "\n" .. body
  end
  return table.concat(loops, "\n")
end

-- The epilogue's prologue of a token: do = dout + the RMSNorm backward of
-- dnormed through normed = out * rr * gain, rr = 1 / sqrt(mean(out^2) +
-- out_eps), in fp32 into gofr (row order), that is
--   do[k] = dout[k] + rr dnormed[k] gain[k] - out[k] rr^3 <dnormed gain, out> / d,
-- and the token's share of d(gain), rr dnormed out, added into its group's
-- row of the workspace. The pair layout reads do in pair order (gof).
local function epilogue_prologue(p)
  return gen.subst([[
        if (epi) {
            const storage_t *o = (const storage_t *)a->out + t * a->out_stride;
            const storage_t *dn = (const storage_t *)a->dnormed + t * a->dnormed_stride;
            float *const dg = a->ws_dgout + g * d;
            vf s0 = {0}, s1 = {0};
            for (int64_t k = 0; k < d; k += ${VEC}) {
                const vf x = load_row(o + k);
                s0 += x * x;
                s1 += x * load_row(dn + k) * load_f32(a->out_gain + k);
            }
            const float rr = 1.0f / sqrtf(hsum(s0) * inv_d + a->out_eps);
            const float coef = rr * rr * rr * hsum(s1) * inv_d;
            for (int64_t k = 0; k < d; k += ${VEC}) {
                const vf x = load_row(o + k), dnk = load_row(dn + k);
                vf y = rr * dnk * load_f32(a->out_gain + k) - coef * x;
                if (go)
                    y += load_row(go + k);
                store_f32(gofr + k, y);
                store_f32(dg + k, load_f32(dg + k) + rr * dnk * x);
            }
${PAIR_ORDER}        }
]], { VEC = p.vec, PAIR_ORDER = p.layout == "pairs" and "            pair_order(gofr, gof, d);\n" or "" })
end

function T.emit(p)
  local name = space.kernel_name(source_id(p))
  local pairs_ = p.layout == "pairs"
  -- Accumulators per reduction: one per vector of a step.
  local acc = pairs_ and 2 * p.unroll or p.unroll
  local vars = {
    STEP = T.step(p),
    zero = rowops.per_lane(acc, "                vf ss%d = {0}, dq%d = {0}, dp%d = {0};"),
    sweep1 = pairs_ and sweep1_pairs(p) or sweep1_rows(p),
    sweep2 = sweep2(p),
    ss = rowops.sum_lanes(acc, "ss"),
    dq = rowops.sum_lanes(acc, "dq"),
    dp = rowops.sum_lanes(acc, "dp"),
    VEC = p.vec,
    prologue = epilogue_prologue(p),
    -- The pair layout reads the query in pair order and sums the group's
    -- du in it, on the stack, in row order into the workspace at the
    -- group's end; with the epilogue, do in pair order too.
    -- The epilogue's rows come after query and dup: declared among them,
    -- they left the plain path's code alike but made it 1.5x slower at
    -- K3's and MHAR-8B's shapes on a Zen 3 guest (bench/mix_ab.sh), with
    -- the du stores the hot spot; the cause in the stack's layout was not
    -- pinned down.
    query = pairs_ and [[
    float query[d], dup[d];
    pair_order(a->query, query, d);
    /* The epilogue's do rows, in row and in pair order. */
    float gofr[epi ? d : 1], gofp[epi ? d : 1];
    const struct scratch s = {q, pd, w, dz, r, c, query, dup, gofr, gofp};]]
        or [[
    /* The epilogue's do row. */
    float gofr[epi ? d : 1];
    const struct scratch s = {q, pd, w, dz, r, c, a->query, NULL, gofr, gofr};]],
    next_row = p.vec > 1 and [[
            /* The next token's row, which sweep 2 prefetches. */
            const storage_t *next = t + 1 < t1 ? row + a->src_stride[i] : row;
]] or "",
    -- Streamed stores are weakly ordered: the launch ends with a fence.
    fence = p.store == "stream" and "    stream_fence();\n" or "",
    du_row = pairs_ and "float *const du = s->dup;" or "float *const du = ws;",
    du_flush = pairs_ and [[
        if (t + 1 == t1 || (t + 1) % a->group == 0)
            pair_unorder(s->dup, ws, d);
]] or "",
  }
  local helpers = storage.helpers(p.dtype, p.vec) .. (pairs_ and storage.pair_helpers(p.dtype, p.vec) or "")
      .. (p.store == "stream" and storage.stream_helpers(p.vec, pairs_) or "")
  local pair_go = pairs_ and gen.subst([[

static inline __attribute__((always_inline)) void load_go_pair(const storage_t *go, const float *gof, int64_t k,
                                                               int epi, vf *lo, vf *hi)
{
    if (epi) {
        *lo = load_f32(gof + k);
        *hi = load_f32(gof + k + ${VEC});
    } else {
        load_pair(go + k, lo, hi);
    }
}
]], vars) or ""
  local decls = helpers .. gen.subst([[

/* The token's gradient of out at k: dout's row, or with the epilogue the
 * fp32 row gof its prologue made (in pair order in the pair layout). The
 * token loop is compiled twice, epi 0 and 1, so the test is folded away. */
static inline __attribute__((always_inline)) vf load_go(const storage_t *go, const float *gof, int64_t k, int epi)
{
    return epi ? load_f32(gof + k) : load_row(go + k);
}
${pair_go}
/* The per-token state, on the entry's stack: per source and head the dots
 * with u (q) and with do (pd), the softmax weight (w) and the score
 * gradient (dz); per source r and c; the query as the sweeps read it, the
 * group's du in pair order (pairs), and the epilogue's do rows. */
struct scratch {
    float *q, *pd, *w, *dz, *r, *c;
    const float *query;
    float *dup, *gofr, *gof;
};

static inline __attribute__((always_inline)) void mix_tokens(const struct attnres_cpu_mix_backward_args *a,
                                                             int64_t t0, int64_t t1, const int epi,
                                                             const struct scratch *s)
{
    const int64_t d = a->d;
    const int n = a->n, heads = a->heads;
    const int64_t hd = d / heads;
    const float inv_d = 1.0f / (float)d, eps = a->eps, scale = a->scale, alpha = a->alpha;
    const int acc = a->accumulate, f32 = a->dsrc_f32;
    float *const q = s->q, *const pd = s->pd, *const w = s->w, *const dz = s->dz, *const r = s->r, *const c = s->c;
    const float *const query = s->query;
    float *const gofr = s->gofr, *const gof = s->gof;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t g = t / a->group;
        float *const ws = a->ws_du + g * d;
        ${du_row}
        if (t == t0 || t % a->group == 0) {
            /* The group's first token: its rows start from zero. */
            memset(du, 0, sizeof(float) * (size_t)d);
            if (epi)
                memset(a->ws_dgout + g * d, 0, sizeof(float) * (size_t)d);
            if (a->ws_dalpha)
                a->ws_dalpha[g] = 0.0f;
        }
        const storage_t *go = a->dout ? (const storage_t *)a->dout + t * a->dout_stride : NULL;
${prologue}        /* Sweep 1: every source row from memory, once. */
        for (int i = 0; i < n; i++) {
            const storage_t *row = (const storage_t *)a->src[i] + t * a->src_stride[i];
            float sumsq = 0.0f;
            for (int h = 0; h < heads; h++) {
${zero}
                for (int64_t k = (int64_t)h * hd; k < (int64_t)(h + 1) * hd; k += ${STEP}) {
${sweep1}
                }
                sumsq += hsum(${ss});
                q[i * heads + h] = hsum(${dq});
                pd[i * heads + h] = hsum(${dp});
            }
            r[i] = 1.0f / sqrtf(sumsq * inv_d + eps);
        }
        /* Per head: the weights, delta' = sum_n w p', and dz. */
        float dalpha = 0.0f;
        for (int h = 0; h < heads; h++) {
            float m = -1e30f;
            for (int i = 0; i < n; i++) {
                const float sc = scale * r[i] * q[i * heads + h];
                w[i * heads + h] = sc;
                m = sc > m ? sc : m;
            }
            float l = 0.0f;
            for (int i = 0; i < n; i++) {
                const float e = expf(w[i * heads + h] - m);
                w[i * heads + h] = e;
                l += e;
            }
            float delta = 0.0f;
            for (int i = 0; i < n; i++) {
                w[i * heads + h] /= l;
                delta += w[i * heads + h] * pd[i * heads + h];
            }
            dalpha += delta;
            for (int i = 0; i < n; i++)
                dz[i * heads + h] = w[i * heads + h] * alpha * (pd[i * heads + h] - delta);
        }
        for (int i = 0; i < n; i++) {
            float ci = 0.0f;
            for (int h = 0; h < heads; h++)
                ci += dz[i * heads + h] * q[i * heads + h];
            c[i] = ci;
        }
        if (a->ws_dalpha)
            a->ws_dalpha[g] += dalpha;
        /* Sweep 2: the same rows, now in cache. */
        for (int i = 0; i < n; i++) {
            const storage_t *row = (const storage_t *)a->src[i] + t * a->src_stride[i];
            /* The gradient row in the storage type, or in fp32 (dvf) when
             * the caller sums source gradients across sites in fp32. */
            storage_t *dv = f32 ? NULL : (storage_t *)a->dsrc[i] + t * a->dsrc_stride[i];
            float *dvf = f32 ? (float *)a->dsrc[i] + t * a->dsrc_stride[i] : NULL;
            const float sr = scale * r[i], xr = sr * r[i] * r[i] * c[i] * inv_d;
${next_row}            for (int h = 0; h < heads; h++) {
                const float wa = w[i * heads + h] * alpha, z = dz[i * heads + h];
                const float zr = scale * z * r[i], zu = sr * z;
                const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
${sweep2}
            }
        }
${du_flush}        if (a->dpartial) {
            /* The additive form: d(partial) = do, in row order. */
            storage_t *dp = (storage_t *)a->dpartial + t * a->dpartial_stride;
            for (int64_t k = 0; k < d; k += ${VEC}) {
                vf y = load_go(go, gofr, k, epi);
                if (acc)
                    y += load_row(dp + k);
                store_row(dp + k, y);
            }
        }
    }
}
]], { pair_go = pair_go, du_row = vars.du_row, prologue = vars.prologue, zero = vars.zero, STEP = vars.STEP,
      sweep1 = vars.sweep1, ss = vars.ss, dq = vars.dq, dp = vars.dp, next_row = vars.next_row,
      sweep2 = vars.sweep2, du_flush = vars.du_flush, VEC = p.vec })
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = decls,
    name = name,
    abi = "cpu_mix_backward",
    body = gen.subst([[
    const int64_t d = a->d;
    const int n = a->n, heads = a->heads;
    /* With the output-norm epilogue (out_gain set) every token starts with
     * its prologue and the sweeps read do from the stack. */
    const int epi = a->out_gain != NULL;
    float q[n * heads], pd[n * heads], w[n * heads], dz[n * heads], r[n], c[n];
${query}
    if (epi)
        mix_tokens(a, t0, t1, 1, &s);
    else
        mix_tokens(a, t0, t1, 0, &s);
${fence}]], vars),
  }
  return src, name
end

return T
