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
--   threads   the most worker threads the launch spreads token groups
--             over: a launch parameter, not part of the source
--             (lib/cpu_space.lua).
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
  space.threads, -- 1, 2, 4, ... 64, set at launch (lib/cpu_space.lua)
}, {
  -- The runtime's built-in fallback: scalar code that fits every d and H,
  -- spread over all cores.
  generic = { vec = 1, unroll = 1, threads = 64 },
  -- The built-in kernels per ISA level (runtime/cpu_builtin.cmake), which a
  -- plan without a database takes before the generic one. One register of
  -- lanes where the level has 8 or 16; two accumulators per reduction where
  -- the registers hold six of them with room to spare (32 zmm, 16 ymm), so
  -- that sweep 1 waits on memory rather than on FMA latency. SSE2 and NEON
  -- take 8 lanes as two registers, once, as the forward built-ins do; their
  -- step of 8 also fits the most head widths.
  builtin = {
    avx512 = { vec = 16, unroll = 2, threads = 64 },
    avx2 = { vec = 8, unroll = 2, threads = 64 },
    sse2 = { vec = 8, unroll = 1, threads = 64 },
    neon = { vec = 8, unroll = 1, threads = 64 },
  },
})

-- AVX512-BF16 CPUs: the AVX-512 variant, compiled with it (see cpu/mix_fused.lua).
T.builtin.avx512bf16 = T.builtin.avx512

T.constraint = space.constraint

local function source_id(p)
  return string.format("mix_backward_c_%s_v%d_u%d", p.dtype, p.vec, p.unroll)
end

space.entries(T, "cpu_mix_backward", source_id)

function T.emit(p)
  local name = space.kernel_name(source_id(p))
  local u, v = p.unroll, p.vec
  local vars = {
    helpers = storage.helpers(p.dtype, v),
    STEP = v * u,
    VEC = v,
    zero = rowops.per_lane(u, "                vf ss%d = {0}, dq%d = {0}, dp%d = {0};"),
    sweep1 = gen.each(u, function(i)
      local j, off = i - 1, (i - 1) * v
      return gen.subst([[
                    const vf x${J} = load_row(row + k + ${OFF});
                    ss${J} += x${J} * x${J};
                    dq${J} += x${J} * load_f32(a->query + k + ${OFF});
                    dp${J} += x${J} * load_row(go + k + ${OFF});]], { J = j, OFF = off })
    end, "\n"),
    ss = rowops.sum_lanes(u, "ss"),
    dq = rowops.sum_lanes(u, "dq"),
    dp = rowops.sum_lanes(u, "dp"),
  }
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = vars.helpers .. "\n",
    name = name,
    abi = "cpu_mix_backward",
    body = gen.subst([[
    const int64_t d = a->d;
    const int n = a->n, heads = a->heads;
    const int64_t hd = d / heads;
    const float inv_d = 1.0f / (float)d, eps = a->eps, scale = a->scale, alpha = a->alpha;
    const int acc = a->accumulate, f32 = a->dsrc_f32;
    /* Per source and head: the dots with u (q) and with dout (pd), the
     * softmax weight (w) and the score gradient (dz); per source r and c. */
    float q[n * heads], pd[n * heads], w[n * heads], dz[n * heads], r[n], c[n];
    for (int64_t t = t0; t < t1; t++) {
        const int64_t g = t / a->group;
        float *du = a->ws_du + g * d;
        if (t == t0 || t % a->group == 0) {
            /* The group's first token: its rows start from zero. */
            memset(du, 0, sizeof(float) * (size_t)d);
            if (a->ws_dalpha)
                a->ws_dalpha[g] = 0.0f;
        }
        const storage_t *go = (const storage_t *)a->dout + t * a->dout_stride;
        /* Sweep 1: every source row from memory, once. */
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
                const float s = scale * r[i] * q[i * heads + h];
                w[i * heads + h] = s;
                m = s > m ? s : m;
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
            for (int h = 0; h < heads; h++) {
                /* dv = wa dout + zu u - xr v: three multiply-adds a vector. */
                const float wa = w[i * heads + h] * alpha, z = dz[i * heads + h], zr = scale * z * r[i];
                const float zu = sr * z;
                for (int64_t k = (int64_t)h * hd; k < (int64_t)(h + 1) * hd; k += ${VEC}) {
                    const vf x = load_row(row + k);
                    vf y = wa * load_row(go + k) + zu * load_f32(a->query + k) - xr * x;
                    if (f32) {
                        if (acc)
                            y += load_f32(dvf + k);
                        store_f32(dvf + k, y);
                    } else {
                        if (acc)
                            y += load_row(dv + k);
                        store_row(dv + k, y);
                    }
                    store_f32(du + k, load_f32(du + k) + zr * x);
                }
            }
        }
        if (a->dpartial) {
            /* The additive form: d(partial) = dout. */
            storage_t *dp = (storage_t *)a->dpartial + t * a->dpartial_stride;
            for (int64_t k = 0; k < d; k += ${VEC}) {
                vf y = load_row(go + k);
                if (acc)
                    y += load_row(dp + k);
                store_row(dp + k, y);
            }
        }
    }
]], vars),
  }
  return src, name
end

return T
