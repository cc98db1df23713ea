-- cpu/phase2_backward.lua: the backward of Block AttnRes phase 2 (DESIGN
-- §1b) as C for the CPU backend, one site, any H.
--
-- The forward (cpu/phase2.lua) merged the site's phase-1 result with the
-- block's partial sum b: per head h, with r = rsqrt(mean(b^2) + eps) and
-- q_h = sum_{k in h} b[k] u[k],
--   p2_h = sigmoid(scale r q_h - lse_h),   out = o1 + p2_h (b - o1).
-- Per token, with G the gradient of out (dout's row):
--   sweep 1, each row from memory once (b, o1, dout): b's sum of squares,
--            and per head its dot q with the query u and
--            pi = sum G (b - o1);
--   then     r, p2 per head (recomputed: the forward saves only lse),
--            dx = p2 (1 - p2) pi (the gradient of the head's score, and
--            negated that of lse, written at once), c = sum_h dx q;
--   sweep 2, over b and G, now in cache: d(o1) = G (1 - p2) and
--            db = G p2 + scale r (dx u - b r^2 c / d), written or added
--            into the caller's buffers (db also into dsublayer when the
--            forward fused the add: the gradient of the sublayer output is
--            the same), and the token's share of du, scale dx r b, added
--            into its token group's fp32 row of the workspace.
-- Sweep 2 reads neither o1 nor lse: G and p2 carry what it needs of them.
--
-- With the output-norm epilogue (normed = RMSNorm(out) * gain, the
-- forward's second output) G = dout + the RMSNorm backward of dnormed,
-- which needs out. Nothing keeps out (the struct has no such row), so the
-- token recomputes it in fp32 as the forward did, y = o1 + p2 (b - o1),
-- unrounded: sweep 1 then gathers only the sum of squares and q (G is not
-- known yet), r and p2 follow, and a prologue of two passes over o1, b and
-- dnormed (in cache after the first) takes rs = rsqrt(mean(y^2) + out_eps)
-- and <dnormed gain, y>, then writes
--   G[k] = dout[k] + rs dnormed[k] gain[k] - y[k] rs^3 <dnormed gain, y> / d
-- (dout NULL: zero) in fp32 to the stack, gathers pi from it, and adds the
-- token's share of d(gain), rs dnormed y, into its group's row of the
-- workspace as du's. Sweep 2 then reads G from the stack. The token loop is
-- one inline function compiled twice, with and without the epilogue, so the
-- plain path pays nothing for it.
--
-- Determinism: the runtime starts every launch on the first token of a
-- group (of a->group tokens, a size fixed by the runtime for every kernel
-- and thread count), a group's tokens run in order on one thread, and the
-- runtime adds the groups' rows in group order after the launch. So du and
-- d(gain) do not depend on how tokens are spread over threads; no atomics.
--
-- With accumulate the caller may pass one buffer for several per-token
-- gradients (do1, dpartial, dsublayer): every such store reads the element
-- back just before it adds to it, so each sum is complete in any aliasing.
--
-- Stack, per launch: per head q, p2, pi and dx (16 H bytes) and, with the
-- epilogue, G's fp32 row (4 d bytes); the rest (scalars, a streamed
-- store's line of 64 bytes) fits in 256. So within 16 H + 256 bytes, plus
-- 8 d bytes with the epilogue: the bound the runtime checks.
--
-- Parameters and why they matter:
--   vec       fp32 lanes per vector (1 = scalar code, 8 = AVX2, 16 = AVX-512).
--   unroll    independent accumulators per loop in sweep 1, to hide FMA
--             latency (three reductions per step share each row's load).
--   store     "stream" (vectors only): d(o1), db and dsublayer, when
--             written rather than added, go past the caches
--             (lib/c_storage.lua's stream_row), which saves reading each
--             line before writing it; "cached": plain stores, for
--             gradients that the caller reads again soon.
--   threads   the most worker threads the launch spreads token groups
--             over: a launch parameter, not part of the source
--             (lib/cpu_space.lua).
-- Rows only: no pair layout (cpu/mix_backward.lua's "pairs") yet.
--
-- In vectors, sweep 2 also prefetches the next token's rows (b, o1 and
-- dout, or dnormed with the epilogue; into L2) at the offsets it works on,
-- so that the next sweep 1 reads them from cache while this token's
-- arithmetic runs, as cpu/mix_backward.lua does (not measured here).
--
-- Numerics: fp32 arithmetic throughout, the storage type only at loads
-- and stores (G stays fp32 on the stack); p2 with the forward's sigmoid;
-- 64-bit offsets.

local storage = require("lib/c_storage")
local space = require("lib/cpu_space")
local backward_rows = require("lib/cpu_backward_rows")
local kernel = require("lib/c_kernel")
local rowops = require("lib/c_rowops")

local T, source_id = backward_rows.template("phase2_backward")

-- Sweep 1's step: unroll vectors of b, each feeding the sum of squares and
-- the dot with u, and without the epilogue pi (G and o1 read here too).
local function sweep1(p)
  return gen.each(p.unroll, function(i)
    return gen.subst([[
                const vf x${J} = load_row(b + k + ${OFF});
                ss${J} += x${J} * x${J};
                dq${J} += x${J} * load_f32(query + k + ${OFF});
                if (!epi)
                    pi${J} += load_row(go + k + ${OFF}) * (x${J} - load_row(o + k + ${OFF}));]],
      { J = i - 1, OFF = (i - 1) * p.vec })
  end, "\n")
end

-- Sweep 2 over one head: d(o1), db (and dsublayer) and the token's share of
-- du, in one of four loops (added or written, with or without dsublayer)
-- chosen once per head, not per vector.
local function sweep2(p)
  local I = "                    "
  local function put(acc, dst, y)
    if acc then
      return string.format("%sstore_row(%s, %s + load_row(%s));\n", I, dst, y, dst)
    end
    return storage.store_row_call(p.store == "stream", dst, y, I)
  end
  local loops = {}
  for n, s in ipairs({
    { cond = "acc && ds", acc = true, ds = true },
    { cond = "acc", acc = true, ds = false },
    { cond = "ds", acc = false, ds = true },
    { cond = nil, acc = false, ds = false },
  }) do
    local body = gen.subst([[
                for (int64_t k = k0; k < k1; k += ${VEC}) {
${PREFETCH}                    const vf x = load_row(b + k), gk = load_go(go, gof, k, epi);
                    const vf y = p2h * gk + zu * load_f32(query + k) - xr * x;
${PUT_DO1}${PUT_DB}${PUT_DS}                    store_f32(du + k, load_f32(du + k) + zu * x);
                }]], {
      VEC = p.vec,
      PREFETCH = p.vec > 1 and [[
                    __builtin_prefetch(nb + k, 0, 2);
                    __builtin_prefetch(no + k, 0, 2);
                    __builtin_prefetch(ng + k, 0, 2);
]] or "",
      PUT_DO1 = put(s.acc, "do1 + k", "om * gk"),
      PUT_DB = put(s.acc, "db + k", "y"),
      PUT_DS = s.ds and put(s.acc, "ds + k", "y") or "",
    })
    local head = s.cond and string.format("%sif (%s)", n == 1 and "" or "else ", s.cond) or "else"
    loops[#loops + 1] = "            " .. head .. "\n" .. body
  end
  return table.concat(loops, "\n")
end

-- The epilogue's prologue of a token, once r and p2 are known: out
-- recomputed as the forward made it, y = o1 + p2 (b - o1) in fp32, its
-- rs = 1 / sqrt(mean(y^2) + out_eps) and <dnormed gain, y> (first pass),
-- then (second pass, rows in cache)
--   G[k] = dout[k] + rs dnormed[k] gain[k] - y[k] rs^3 <dnormed gain, y> / d
-- into gof, pi per head from it, and the token's share of d(gain),
-- rs dnormed y, added into its group's row of the workspace.
local function epilogue_prologue(p)
  return gen.subst([[
        if (epi) {
            const storage_t *dn = (const storage_t *)a->dnormed + t * a->dnormed_stride;
            float *const dg = a->ws_dgout + g * d;
            vf s0 = {0}, s1 = {0};
            for (int h = 0; h < heads; h++) {
                const float p2h = p2[h];
                for (int64_t k = (int64_t)h * hd; k < (int64_t)(h + 1) * hd; k += ${VEC}) {
                    const vf ov = load_row(o + k);
                    const vf y = ov + p2h * (load_row(b + k) - ov);
                    s0 += y * y;
                    s1 += y * load_row(dn + k) * load_f32(a->out_gain + k);
                }
            }
            const float rs = 1.0f / sqrtf(hsum(s0) * inv_d + a->out_eps);
            const float coef = rs * rs * rs * hsum(s1) * inv_d;
            for (int h = 0; h < heads; h++) {
                const float p2h = p2[h];
                vf ps = {0};
                for (int64_t k = (int64_t)h * hd; k < (int64_t)(h + 1) * hd; k += ${VEC}) {
                    const vf ov = load_row(o + k), x = load_row(b + k), dnk = load_row(dn + k);
                    const vf y = ov + p2h * (x - ov);
                    vf gk = rs * dnk * load_f32(a->out_gain + k) - coef * y;
                    if (go)
                        gk += load_row(go + k);
                    store_f32(gof + k, gk);
                    store_f32(dg + k, load_f32(dg + k) + rs * dnk * y);
                    ps += gk * (x - ov);
                }
                pi[h] = hsum(ps);
            }
        }
]], { VEC = p.vec })
end

function T.emit(p)
  local name = space.kernel_name(source_id(p))
  local vars = {
    STEP = T.step(p),
    zero = rowops.per_lane(p.unroll, "            vf ss%d = {0}, dq%d = {0}, pi%d = {0};"),
    sweep1 = sweep1(p),
    sweep2 = sweep2(p),
    ss = rowops.sum_lanes(p.unroll, "ss"),
    dq = rowops.sum_lanes(p.unroll, "dq"),
    pi = rowops.sum_lanes(p.unroll, "pi"),
    prologue = epilogue_prologue(p),
    next_rows = p.vec > 1 and [[
        /* The next token's rows, which sweep 2 prefetches: those its sweep
         * 1 and prologue read first. The last token prefetches its own. */
        const int64_t tn = t + 1 < t1 ? t + 1 : t;
        const storage_t *nb = (const storage_t *)a->partial + tn * a->partial_stride;
        const storage_t *no = (const storage_t *)a->o1 + tn * a->o1_stride;
        const storage_t *ng = epi ? (const storage_t *)a->dnormed + tn * a->dnormed_stride
                                  : (const storage_t *)a->dout + tn * a->dout_stride;
]] or "",
    -- Streamed stores are weakly ordered: the launch ends with a fence.
    fence = p.store == "stream" and "    stream_fence();\n" or "",
  }
  local helpers = storage.helpers(p.dtype, p.vec)
      .. (p.store == "stream" and storage.stream_helpers(p.vec, false) or "")
  local decls = helpers .. "\n" .. rowops.sigmoid .. gen.subst([[

/* The token's gradient of out at k: dout's row, or with the epilogue the
 * fp32 row gof its prologue made. The token loop is compiled twice, epi 0
 * and 1, so the test is folded away. */
static inline __attribute__((always_inline)) vf load_go(const storage_t *go, const float *gof, int64_t k, int epi)
{
    return epi ? load_f32(gof + k) : load_row(go + k);
}

/* The per-token state, on the entry's stack: per head the dot of b with u
 * (q), the weight of b (p2), <G, b - o1> (pi) and the score gradient (dx);
 * the epilogue's G row (gof). */
struct scratch {
    float *q, *p2, *pi, *dx, *gof;
};

static inline __attribute__((always_inline)) void phase2_tokens(const struct attnres_cpu_phase2_backward_args *a,
                                                                int64_t t0, int64_t t1, const int epi,
                                                                const struct scratch *s)
{
    const int64_t d = a->d;
    const int heads = a->heads;
    const int64_t hd = d / heads;
    const float inv_d = 1.0f / (float)d, eps = a->eps, scale = a->scale;
    const int acc = a->accumulate;
    const float *const query = a->query;
    float *const q = s->q, *const p2 = s->p2, *const pi = s->pi, *const dx = s->dx, *const gof = s->gof;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t g = t / a->group;
        float *const du = a->ws_du + g * d;
        if (t == t0 || t % a->group == 0) {
            /* The group's first token: its rows start from zero. */
            memset(du, 0, sizeof(float) * (size_t)d);
            if (epi)
                memset(a->ws_dgout + g * d, 0, sizeof(float) * (size_t)d);
        }
        const storage_t *b = (const storage_t *)a->partial + t * a->partial_stride;
        const storage_t *o = (const storage_t *)a->o1 + t * a->o1_stride;
        const float *lse = a->lse + t * a->lse_stride;
        /* dout: needed without the epilogue; with it NULL reads as zero. */
        const storage_t *go = a->dout ? (const storage_t *)a->dout + t * a->dout_stride : NULL;
        /* Sweep 1: b, o1 and dout from memory, once (b alone with the
         * epilogue, whose G needs p2 first). */
        float sumsq = 0.0f;
        for (int h = 0; h < heads; h++) {
${zero}
            for (int64_t k = (int64_t)h * hd; k < (int64_t)(h + 1) * hd; k += ${STEP}) {
${sweep1}
            }
            sumsq += hsum(${ss});
            q[h] = hsum(${dq});
            if (!epi)
                pi[h] = hsum(${pi});
        }
        const float r = 1.0f / sqrtf(sumsq * inv_d + eps);
        for (int h = 0; h < heads; h++)
            p2[h] = sigmoid(scale * r * q[h] - lse[h]);
${prologue}        /* Per head: the score gradient dx, and -dx for lse; c = sum dx q. */
        float *dl = a->dlse + t * a->dlse_stride;
        float c = 0.0f;
        for (int h = 0; h < heads; h++) {
            dx[h] = p2[h] * (1.0f - p2[h]) * pi[h];
            dl[h] = acc ? dl[h] - dx[h] : -dx[h];
            c += dx[h] * q[h];
        }
        /* Sweep 2: b and G again, now in cache. */
        storage_t *do1 = (storage_t *)a->do1 + t * a->do1_stride;
        storage_t *db = (storage_t *)a->dpartial + t * a->dpartial_stride;
        storage_t *ds = a->dsublayer ? (storage_t *)a->dsublayer + t * a->dsublayer_stride : NULL;
        const float sr = scale * r, xr = sr * r * r * c * inv_d;
${next_rows}        for (int h = 0; h < heads; h++) {
            const float p2h = p2[h], om = 1.0f - p2h, zu = sr * dx[h];
            const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
${sweep2}
        }
    }
}
]], vars)
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = decls,
    name = name,
    abi = "cpu_phase2_backward",
    body = gen.subst([[
    const int64_t d = a->d;
    const int heads = a->heads;
    /* With the output-norm epilogue (out_gain set) every token starts with
     * its prologue and sweep 2 reads G from the stack. */
    const int epi = a->out_gain != NULL;
    float q[heads], p2[heads], pi[heads], dx[heads];
    /* The epilogue's G row. */
    float gof[epi ? d : 1];
    const struct scratch s = {q, p2, pi, dx, gof};
    if (epi)
        phase2_tokens(a, t0, t1, 1, &s);
    else
        phase2_tokens(a, t0, t1, 0, &s);
${fence}]], vars),
  }
  return src, name
end

return T
