-- cpu/phase1_backward.lua: the backward of Block AttnRes phase 1 (DESIGN §1,
-- two-phase form) as C for the CPU backend: the n sources of one block
-- against its S sites' folded queries, any H.
--
-- Per token, with site j's incoming gradients do1_j (a row) and dlse_j (H
-- floats, phase 2's backward; zero where the caller passes none):
--   sweep 1, each source row from memory once, head by head: its sum of
--            squares, and for every site j the per-head dots q with u_j and
--            p with do1_j (the head's slice of the row is in L1 from the
--            first site on; for a few sites the S do1 rows and queries stay
--            in cache across the n sources, see Cost below);
--   then     r, the scores and each site's softmax weights a per head
--            (recomputed: the forward keeps only o1 and lse), delta =
--            sum_i a p per site and head, the score gradients
--            dz = a (p - delta + dlse), and c_i = sum_j sum_h dz q; dz is
--            then scaled by scale r_i, the factor that sweep 2 multiplies
--            both u_j and v_i by;
--   sweep 2, over the same rows, now in cache: the source gradients
--            dv_i = sum_j (a do1_j + scale r_i dz u_j) - scale r_i^3 c_i v_i / d,
--            written or added into the caller's buffer (storage type, or
--            fp32 when the runtime sets dsrc_f32), and the token's share of
--            each site's du_j, scale r_i dz v_i, added into its token
--            group's fp32 row for site j of the workspace.
-- Taking delta from p (dots of do1 with the sources, in sweep 1) instead of
-- from the forward's o1 needs no o1 and keeps n = 1 exact: a = 1, p - delta
-- is exactly 0 (computed before dlse is added), so dz is dlse alone.
--
-- Both sweeps go by column blocks of each head (BLOCK elements): a block
-- starts by copying every site's slices of u and of do1 (widened) into
-- stack rows a cache line longer than the block, and sweep 2 gathers du's
-- slices in such rows too, adding them to the workspace at the block's
-- end. The caller's rows of u, do1 and du lie a multiple of 4 KiB apart
-- whenever d is a multiple of 1024 (as at every model's width), so at one
-- offset they all fall in one L1 set, and a du store seems to feed the next
-- row's load (4K aliasing); the padded rows fall in different sets. Sweep
-- 2 takes the sites innermost: each step loads the source's lanes once
-- and folds every site's do1 and u lanes into the gradient in registers.
-- The per-token state (the entry's stack) is per source i, site j and head
-- h four floats (q, p, a, dz, at (i * S + j) * H + h), per source r and c,
-- and the three padded rows per site: 16 n S H + 8 n + 12 S PAD bytes, with
-- the sweeps' scalars inside 16 n S H + 8 n + 12 S PAD + 256 bytes (the
-- runtime's cpu_stack_bytes); the runtime caps n S H at 32768 (512 KiB).
--
-- Determinism: as cpu/mix_backward.lua. The runtime starts every launch on
-- the first token of a group (of a->group tokens), a group's tokens run in
-- order on one thread, and the runtime adds the groups' rows (S rows of d
-- floats per group, site j's at (g * S + j) * d) in group order after the
-- launch. So the query gradients do not depend on how tokens are spread
-- over threads.
--
-- Parameters and why they matter:
--   vec       fp32 lanes per vector (1 = scalar code, 8 = AVX2, 16 = AVX-512).
--   unroll    vectors per loop step, each with its own accumulators in sweep
--             1 (to hide FMA latency: two or three reductions share each
--             load) and sharing each site's two broadcast weights in
--             sweep 2.
--   store     "stream" (vectors only): fresh gradients in the storage type
--             go past the caches (lib/c_storage.lua's stream_row), which
--             saves reading each line before writing it; "cached": plain
--             stores, for gradients that the caller reads again soon.
--   threads   the most worker threads the launch spreads token groups
--             over: a launch parameter, not part of the source
--             (lib/cpu_space.lua).
--
-- In vectors sweep 2 also prefetches the next token's source rows (into
-- L2) at the offsets it works on, as cpu/mix_backward.lua does, so that the
-- next sweep 1 reads them from cache.
--
-- Cost: every source meets every site in both sweeps, O(n S d) arithmetic
-- a token, and the S padded rows of a block pass through L1 once per
-- source. On a Zen 3 guest (bf16, 8 lanes, u2, streamed, one thread, T =
-- 32, quiet), at K3's block shape (d = 7168, n = 8, S = 24, H = 1) the
-- kernel took 0.66-0.78 ms a token, against 1.62-1.67 ms without the blocks
-- and padded rows; at d = 4096, H = 8 (same n and S) 0.44 against 1.11-1.16.
-- Before the padding, d = 7232 had run about 3x faster than d = 7168.
--
-- Unlike cpu/phase1.lua this kernel keeps the CPU's own tuning: its loops
-- are cpu/mix_backward.lua's kind, not phase 1's register tiles; compiled
-- for that Zen 3 guest (znver3) it moved no pointer through a vector
-- register, and scheduled for a generic x86-64 it ran within the noise.
--
-- Numerics: fp32 arithmetic throughout, the storage type only at loads
-- and stores; the softmax's running max starts at -1e30f (never -inf), as
-- in cpu/phase1.lua; 64-bit offsets.

local storage = require("lib/c_storage")
local space = require("lib/cpu_space")
local backward_rows = require("lib/cpu_backward_rows")
local kernel = require("lib/c_kernel")
local rowops = require("lib/c_rowops")

local T, source_id = backward_rows.template("phase1_backward")

-- Per-token scores the kernel keeps on the stack (four floats each); must
-- agree with AR_CPU_PHASE1_MAX_WEIGHTS in runtime/src/cpu_phase_abi.h.
local MAX_WEIGHTS = 1 << 15

-- Both sweeps go by column blocks of BLOCK elements of a head (a multiple
-- of every step). A block starts by copying every site's slices of u and of
-- do1 (widened to fp32) into stack rows PAD floats apart (a cache line more
-- than the block), where du's slices gather too (see the header). PAD must
-- agree with AR_CPU_PHASE1_BACKWARD_PAD in runtime/src/cpu_phase_abi.h,
-- which sizes the stack.
local BLOCK, PAD = 256, 272

function T.applies(p, problem, device)
  local ok, why = space.applies(T, p, problem, device)
  if not ok then return false, why end
  if (problem.s or 0) < 1 then return false, "phase1 needs S >= 1 sites" end
  if problem.n * problem.s * problem.heads > MAX_WEIGHTS then
    return false, string.format("n*S*H = %d scores exceed the %d a launch keeps on the stack",
                                problem.n * problem.s * problem.heads, MAX_WEIGHTS)
  end
  return true
end

-- The two helpers of sweep 1: one site's dots with a head's slice of the
-- row, with its sum of squares (the first site, which reads the row from
-- memory) or without (the others, from L1).
local function site_dots(p, with_ss)
  local u = p.unroll
  return gen.subst([[
/* Block [k0, k1) of a source row against one site: the dot with its
 * query's slice u (q) and with its do1 slice go, widened (p)${WHAT} */
static inline __attribute__((always_inline)) ${RET} ${NAME}(const storage_t *row, const float *u,
${PAD}const float *go, int64_t k0, int64_t k1,
${PAD}float *q, float *p)
{
${zero}
    for (int64_t k = k0; k < k1; k += ${STEP}) {
${body}
    }
    *q = hsum(${dq});
    *p = hsum(${dp});${RETURN}
}
]], {
    WHAT = with_ss and ", and its sum of\n * squares, returned." or ".",
    RET = with_ss and "float" or "void",
    NAME = with_ss and "site_dots_ss" or "site_dots",
    PAD = string.rep(" ", #"static inline __attribute__((always_inline)) " +
                          #(with_ss and "float " or "void ") + #(with_ss and "site_dots_ss(" or "site_dots(")),
    zero = rowops.per_lane(u, with_ss and "    vf ss%d = {0}, dq%d = {0}, dp%d = {0};"
                                     or "    vf dq%d = {0}, dp%d = {0};"),
    STEP = p.vec * u,
    body = gen.each(u, function(i)
      return gen.subst([[
        const vf x${J} = load_row(row + k + ${OFF});
${SS}        dq${J} += x${J} * load_f32(u + k + ${OFF});
        dp${J} += x${J} * load_f32(go + k + ${OFF});]], {
        J = i - 1, OFF = (i - 1) * p.vec,
        SS = with_ss and string.format("        ss%d += x%d * x%d;\n", i - 1, i - 1, i - 1) or "" })
    end, "\n"),
    dq = rowops.sum_lanes(u, "dq"),
    dp = rowops.sum_lanes(u, "dp"),
    RETURN = with_ss and "\n    return hsum(" .. rowops.sum_lanes(u, "ss") .. ");" or "",
  })
end

-- Copies every site's slice [kb, kb + kn) of u and of the token's do1
-- (widened) into the padded stack rows up and gp.
local function pack_sites(p)
  return gen.subst([[
/* Every site's slice [kb, kb + kn) of its query and of the token's do1
 * row (at toff), widened, into stack rows ${PAD} floats apart. */
static inline __attribute__((always_inline)) void pack_sites(const struct attnres_cpu_phase1_backward_args *a,
                                                             int64_t toff, int64_t kb, int64_t kn, float *up,
                                                             float *gp)
{
    for (int j = 0; j < a->s; j++) {
        const float *u = a->queries + (int64_t)j * a->d + kb;
        const storage_t *go = (const storage_t *)a->do1[j] + toff + kb;
        float *const uj = up + j * ${PAD}, *const gj = gp + j * ${PAD};
        for (int64_t k = 0; k < kn; k += ${VEC}) {
            store_f32(uj + k, load_f32(u + k));
            store_f32(gj + k, load_row(go + k));
        }
    }
}
]], { PAD = PAD, VEC = p.vec })
end

-- Where sweep 2 writes the gradient vectors y<J>, one of four loops (fp32 or
-- storage rows, written or added) chosen once per head, not per vector.
local gradient_stores = {
  { cond = "f32 && acc", store = "store_f32(dvf + k + ${OFF}, y${J} + load_f32(dvf + k + ${OFF}));" },
  { cond = "f32", store = "store_f32(dvf + k + ${OFF}, y${J});" },
  { cond = "acc", store = "store_row(dv + k + ${OFF}, y${J} + load_row(dv + k + ${OFF}));" },
  { cond = nil, store = "${STORE_ROW}(dv + k + ${OFF}, y${J});" },
}

-- Sweep 2 over one head of one source: per step, the row's unroll vectors
-- once, each site's do1 and query lanes folded into the gradient (two
-- multiply-adds a vector) and its du row updated (one), then the store.
local function sweep2(p)
  local u = p.unroll
  local per = function(fmt, extra)
    return gen.each(u, function(i)
      local v = { J = i - 1, OFF = (i - 1) * p.vec }
      for k, x in pairs(extra or {}) do v[k] = x end
      return gen.subst(fmt, v)
    end, "\n")
  end
  local step = gen.subst([[
                    for (int64_t k = k0; k < k1; k += ${STEP}) {
${prefetch}${load}
                        for (int j = 0; j < sites; j++) {
                            const float wa = wi[j * heads + h], zs = zi[j * heads + h];
                            const float *go = gp + j * ${PAD}, *u = up + j * ${PAD};
                            float *du = dup + j * ${PAD};
${fold}
                        }
${STORE}
                    }]], {
    STEP = p.vec * u,
    PAD = PAD,
    prefetch = p.vec > 1 and (per("                        __builtin_prefetch(next + k + ${OFF}, 0, 2);") .. "\n") or "",
    load = per([[
                        const vf x${J} = load_row(row + k + ${OFF});
                        vf y${J} = -xr * x${J};]]),
    fold = per([[
                            y${J} += wa * load_f32(go + k + ${OFF}) + zs * load_f32(u + k + ${OFF});
                            store_f32(du + k + ${OFF}, load_f32(du + k + ${OFF}) + zs * x${J});]]),
    STORE = "${STORE}",
  })
  local loops = {}
  for n, s in ipairs(gradient_stores) do
    local store = per("                        " .. s.store,
                      { STORE_ROW = p.store == "stream" and "stream_row" or "store_row" })
    local head = s.cond and string.format("%sif (%s)", n == 1 and "" or "else ", s.cond) or "else"
    loops[#loops + 1] = "                " .. head .. "\n" .. (step:gsub("%${STORE}", function() return store end))
  end
  return table.concat(loops, "\n")
end

function T.emit(p)
  local name = space.kernel_name(source_id(p))
  local vars = {
    -- Inside the source loop, a level deeper than a head's.
    sweep2 = (("    " .. sweep2(p)):gsub("\n", "\n    ")),
    next_row = p.vec > 1 and [[
                    /* The next token's row, which sweep 2 prefetches. */
                    const storage_t *next = t + 1 < t1 ? row + a->src_stride[i] : row;
]] or "",
    BLOCK = BLOCK,
    PAD = PAD,
    VEC = p.vec,
    -- Streamed stores are weakly ordered: the launch ends with a fence.
    fence = p.store == "stream" and "    stream_fence();\n" or "",
  }
  local decls = storage.helpers(p.dtype, p.vec)
      .. (p.store == "stream" and storage.stream_helpers(p.vec, false) or "")
      .. "\n" .. site_dots(p, true) .. "\n" .. site_dots(p, false) .. "\n" .. pack_sites(p)
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = decls,
    name = name,
    abi = "cpu_phase1_backward",
    body = gen.subst([[
    const int64_t d = a->d;
    const int n = a->n, heads = a->heads, sites = a->s;
    const int64_t hd = d / heads, nw = (int64_t)sites * heads;
    const float inv_d = 1.0f / (float)d, eps = a->eps, scale = a->scale;
    const int acc = a->accumulate, f32 = a->dsrc_f32;
    /* The per-token state: per source i, site j and head h, at
     * (i * sites + j) * heads + h, the dots with u_j (q) and with do1_j
     * (pd), the softmax weight (w) and the score gradient (dz); per source
     * r and c. */
    float q[n * nw], pd[n * nw], w[n * nw], dz[n * nw], r[n], c[n];
    /* A column block's padded slices of every site's u, do1 and du. */
    float up[sites * ${PAD}], gp[sites * ${PAD}], dup[sites * ${PAD}];
    for (int64_t t = t0; t < t1; t++) {
        const int64_t g = t / a->group;
        /* The group's S rows of du, site j's at j * d. */
        float *const ws = a->ws_du + g * sites * d;
        if (t == t0 || t % a->group == 0) {
            /* The group's first token: its rows start from zero. */
            memset(ws, 0, sizeof(float) * (size_t)(sites * d));
        }
        const int64_t toff = t * a->do1_stride;
        /* Sweep 1: every source row from memory, once, by column blocks of
         * each head: a block of each source in turn against every site's
         * padded slices (pack_sites), the first site's dots taking the sum
         * of squares with them. The sums gather in r, the dots in q and pd. */
        memset(q, 0, sizeof(float) * (size_t)(n * nw));
        memset(pd, 0, sizeof(float) * (size_t)(n * nw));
        for (int i = 0; i < n; i++)
            r[i] = 0.0f;
        for (int h = 0; h < heads; h++)
            for (int64_t kb = (int64_t)h * hd; kb < (int64_t)(h + 1) * hd; kb += ${BLOCK}) {
                const int64_t kn = (int64_t)(h + 1) * hd - kb < ${BLOCK} ? (int64_t)(h + 1) * hd - kb : ${BLOCK};
                pack_sites(a, toff, kb, kn, up, gp);
                for (int i = 0; i < n; i++) {
                    const storage_t *row = (const storage_t *)a->src[i] + t * a->src_stride[i] + kb;
                    float *const qi = q + i * nw, *const pi = pd + i * nw;
                    float dq, dp;
                    r[i] += site_dots_ss(row, up, gp, 0, kn, &dq, &dp);
                    qi[h] += dq;
                    pi[h] += dp;
                    for (int j = 1; j < sites; j++) {
                        site_dots(row, up + j * ${PAD}, gp + j * ${PAD}, 0, kn, &dq, &dp);
                        qi[j * heads + h] += dq;
                        pi[j * heads + h] += dp;
                    }
                }
            }
        for (int i = 0; i < n; i++)
            r[i] = 1.0f / sqrtf(r[i] * inv_d + eps);
        /* Per site and head: the softmax over the sources, delta =
         * sum_i w p, and dz = w (p - delta + dlse), p - delta first so that
         * one source gives exactly dlse. Source i's entry is i * nw away. */
        for (int j = 0; j < sites; j++) {
            const float *dl = a->dlse && a->dlse[j] ? a->dlse[j] + t * a->dlse_stride : NULL;
            for (int h = 0; h < heads; h++) {
                const int64_t o = (int64_t)j * heads + h;
                float m = -1e30f;
                for (int i = 0; i < n; i++) {
                    const float sc = scale * r[i] * q[i * nw + o];
                    w[i * nw + o] = sc;
                    m = sc > m ? sc : m;
                }
                float l = 0.0f;
                for (int i = 0; i < n; i++) {
                    const float e = expf(w[i * nw + o] - m);
                    w[i * nw + o] = e;
                    l += e;
                }
                const float inv = 1.0f / l;
                float delta = 0.0f;
                for (int i = 0; i < n; i++) {
                    w[i * nw + o] *= inv;
                    delta += w[i * nw + o] * pd[i * nw + o];
                }
                const float lg = dl ? dl[h] : 0.0f;
                for (int i = 0; i < n; i++)
                    dz[i * nw + o] = w[i * nw + o] * ((pd[i * nw + o] - delta) + lg);
            }
        }
        /* c_i = sum over sites and heads of dz q; then dz becomes
         * scale r_i dz, the weight of u_j in dv_i and of v_i in du_j. */
        for (int i = 0; i < n; i++) {
            float ci = 0.0f;
            for (int64_t o = 0; o < nw; o++)
                ci += dz[i * nw + o] * q[i * nw + o];
            c[i] = ci;
            const float sr = scale * r[i];
            for (int64_t o = 0; o < nw; o++)
                dz[i * nw + o] *= sr;
        }
        /* Sweep 2: the same rows, now in cache, by the same column blocks:
         * every source in turn folds the sites' padded slices into its
         * gradient and adds its share to their du slices (dup), which then
         * go to the group's rows of the workspace. */
        for (int h = 0; h < heads; h++)
            for (int64_t kb = (int64_t)h * hd; kb < (int64_t)(h + 1) * hd; kb += ${BLOCK}) {
                const int64_t k0 = 0, k1 = (int64_t)(h + 1) * hd - kb < ${BLOCK} ? (int64_t)(h + 1) * hd - kb : ${BLOCK};
                pack_sites(a, toff, kb, k1, up, gp);
                memset(dup, 0, sizeof(float) * (size_t)(sites * ${PAD}));
                for (int i = 0; i < n; i++) {
                    const storage_t *row = (const storage_t *)a->src[i] + t * a->src_stride[i] + kb;
                    /* The gradient row in the storage type, or in fp32 (dvf)
                     * when the caller sums source gradients in fp32. */
                    storage_t *dv = f32 ? NULL : (storage_t *)a->dsrc[i] + t * a->dsrc_stride[i] + kb;
                    float *dvf = f32 ? (float *)a->dsrc[i] + t * a->dsrc_stride[i] + kb : NULL;
                    const float xr = scale * r[i] * r[i] * r[i] * c[i] * inv_d;
                    const float *const wi = w + i * nw, *const zi = dz + i * nw;
${next_row}${sweep2}
                }
                for (int j = 0; j < sites; j++) {
                    float *const du = ws + (int64_t)j * d + kb;
                    const float *const dj = dup + j * ${PAD};
                    for (int64_t k = 0; k < k1; k += ${VEC})
                        store_f32(du + k, load_f32(du + k) + load_f32(dj + k));
                }
            }
    }
${fence}]], vars),
  }
  return src, name
end

return T
