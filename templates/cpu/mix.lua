-- cpu/mix.lua: the AttnRes depth mix (DESIGN §1) as C for the CPU backend.
--
-- Parameters and why they matter:
--   schedule  "online": per source, compute its statistics and fold it into
--             a running softmax at once, while its row is still in L1;
--             "twopass": all scores first, then one sweep that reads the N
--             rows side by side and writes the output without a scratch row;
--             "pipelined": two-pass, software-pipelined across tokens: the
--             sweep that mixes token t (rows still in L2) also computes the
--             statistics of token t + 1, so memory streams while it computes.
--   vec       fp32 lanes per vector (1 = scalar code, 8 = AVX2, 16 = AVX-512).
--   unroll    independent accumulators per loop, to hide FMA latency.
--   threads   the most worker threads the launch spreads tokens over: a
--             launch parameter, not part of the source (lib/cpu_space.lua).
-- The kernel entry processes tokens [t0, t1); the runtime splits T.

local template = require("lib/template")
local storage = require("lib/c_storage")
local rowops = require("lib/c_rowops")
local space = require("lib/cpu_space")
local kernel = require("lib/c_kernel")

local T = template.new("cpu", "mix", {
  { name = "schedule", values = { "online", "twopass", "pipelined" } },
  { name = "vec", values = { 1, 8, 16 } },
  { name = "unroll", values = { 1, 2, 4 } },
  space.threads, -- 1, 2, 4, ... 64, set at launch (lib/cpu_space.lua)
}, {
  -- The runtime's built-in fallback: scalar code that fits every d and H,
  -- spread over all cores.
  generic = { schedule = "online", vec = 1, unroll = 1, threads = 64 },
})

function T.constraint(p)
  -- The pipelined sweep already keeps 2N independent accumulators per lane.
  return space.constraint(p) and not (p.schedule == "pipelined" and p.unroll ~= 1)
end

-- The id of a variant's source: its id without the thread count.
local function source_id(p)
  return string.format("mix_c_%s_%s_v%d_u%d", p.dtype, p.schedule, p.vec, p.unroll)
end

space.entries(T, "cpu_mix", source_id)

-- Writes one head's output lanes from fp32 vector `o` at offset k: the
-- additive form adds the partial sum; the epilogue keeps o in `keep`.
local function finish_lane()
  return [[
            if (partial)
                o = load_row(partial + k) + alpha * o;
            store_row(out + k, o);
            if (normed) {
                sq += o * o;
                store_f32(keep + k, o);
            }]]
end

local function epilogue(p)
  return gen.subst([[
        if (normed) {
            const float rs = 1.0f / sqrtf(hsum(sq) * inv_d + a->out_eps);
            for (int64_t k = 0; k < d; k += ${VEC})
                store_row(normed + k, load_f32(keep + k) * rs * load_f32(a->out_gain + k));
        }]], { VEC = p.vec })
end

local function body_online(p)
  return gen.subst([[
        float m[heads], l[heads];
        for (int h = 0; h < heads; h++) {
            m[h] = -1e30f; /* never -inf, so exp(m_old - m_new) is never NaN */
            l[h] = 0.0f;
        }
        for (int i = 0; i < n; i++) {
            const storage_t *row = (const storage_t *)a->src[i] + t * a->src_stride[i];
            const float r = 1.0f / sqrtf(row_stats(row, a->query, hd, heads, dot) * inv_d + eps);
            for (int h = 0; h < heads; h++) {
                const float s = scale * r * dot[h];
                const float m_new = fmaxf(m[h], s);
                const float c = expf(m[h] - m_new), e = expf(s - m_new);
                l[h] = l[h] * c + e;
                m[h] = m_new;
                const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
                if (i == 0) {
                    for (int64_t k = k0; k < k1; k += ${VEC})
                        store_f32(acc + k, e * load_row(row + k));
                } else {
                    for (int64_t k = k0; k < k1; k += ${VEC})
                        store_f32(acc + k, load_f32(acc + k) * c + e * load_row(row + k));
                }
            }
        }
        vf sq = {0};
        float *keep = acc; /* the epilogue reuses the accumulator row */
        for (int h = 0; h < heads; h++) {
            const float inv = 1.0f / l[h];
            const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
            for (int64_t k = k0; k < k1; k += ${VEC}) {
                vf o = load_f32(acc + k) * inv;
${finish}
            }
        }
${epilogue}]], { VEC = p.vec, finish = gen.indent(finish_lane(p), 4), epilogue = epilogue(p) })
end

local function body_twopass(p)
  local u = p.unroll
  return gen.subst([[
        const storage_t *rows[n];
        for (int i = 0; i < n; i++) {
            rows[i] = (const storage_t *)a->src[i] + t * a->src_stride[i];
            const float r = 1.0f / sqrtf(row_stats(rows[i], a->query, hd, heads, dot) * inv_d + eps);
            for (int h = 0; h < heads; h++)
                weight[i * heads + h] = scale * r * dot[h];
        }
        depth_softmax(weight, weight, n, heads);
        vf sq = {0};
        float *keep = acc;
        for (int h = 0; h < heads; h++) {
            const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
            for (int64_t kb = k0; kb < k1; kb += ${STEP}) {
${zero}
                for (int i = 0; i < n; i++) {
                    const float w = weight[i * heads + h];
${accumulate}
                }
${lanes}
            }
        }
${epilogue}]], {
    STEP = p.vec * u,
    zero = gen.each(u, function(i) return string.format("                vf o%d = {0};", i - 1) end, "\n"),
    accumulate = gen.each(u, function(i)
      return string.format("                    o%d += w * load_row(rows[i] + kb + %d);", i - 1, (i - 1) * p.vec)
    end, "\n"),
    lanes = gen.each(u, function(i)
      return string.format("                {\n                    const int64_t k = kb + %d;\n" ..
                           "                    vf o = o%d;\n", (i - 1) * p.vec, i - 1) ..
             gen.indent(finish_lane(p), 8) .. "\n                }"
    end, "\n"),
    epilogue = epilogue(p),
  })
end

-- Runs before the token loop of the pipelined schedule: token t0's scores.
local function prologue_pipelined()
  return [[
    if (t0 >= t1)
        return; /* the prologue below would read token t0 */
    /* Token t0's scores; each iteration then mixes token t from rows still
     * in L2 while it streams token t + 1's rows from memory. */
    const storage_t *cur[n], *next[n];
    float score[n * heads];
    vf ss[n], dp[n];
    for (int i = 0; i < n; i++) {
        next[i] = (const storage_t *)a->src[i] + t0 * a->src_stride[i];
        const float r = 1.0f / sqrtf(row_stats(next[i], a->query, hd, heads, dot) * inv_d + eps);
        for (int h = 0; h < heads; h++)
            score[i * heads + h] = scale * r * dot[h];
    }
]]
end

local function body_pipelined(p)
  return gen.subst([[
        depth_softmax(score, weight, n, heads);
        /* The last token re-reads its own rows as "next": harmless. */
        const int more = t + 1 < t1;
        for (int i = 0; i < n; i++) {
            cur[i] = next[i];
            next[i] = more ? (const storage_t *)a->src[i] + (t + 1) * a->src_stride[i] : cur[i];
            ss[i] = (vf){0};
        }
        vf sq = {0};
        float *keep = acc;
        for (int h = 0; h < heads; h++) {
            const int64_t k0 = (int64_t)h * hd, k1 = k0 + hd;
            for (int i = 0; i < n; i++)
                dp[i] = (vf){0};
            for (int64_t k = k0; k < k1; k += ${VEC}) {
                vf o = {0};
                const vf q = load_f32(a->query + k);
                for (int i = 0; i < n; i++) {
                    o += weight[i * heads + h] * load_row(cur[i] + k);
                    const vf x = load_row(next[i] + k);
                    ss[i] += x * x;
                    dp[i] += x * q;
                }
${finish}
            }
            /* Raw dot products of token t + 1; scaled once its RMS is known. */
            for (int i = 0; i < n; i++)
                score[i * heads + h] = hsum(dp[i]);
        }
        for (int i = 0; i < n; i++) {
            const float r = 1.0f / sqrtf(hsum(ss[i]) * inv_d + eps);
            for (int h = 0; h < heads; h++)
                score[i * heads + h] *= scale * r;
        }
${epilogue}]], { VEC = p.vec, finish = gen.indent(finish_lane(p), 4), epilogue = epilogue(p) })
end

local bodies = { online = body_online, twopass = body_twopass, pipelined = body_pipelined }

function T.emit(p)
  local name = space.kernel_name(source_id(p))
  local body = bodies[p.schedule](p)
  local src = kernel.source {
    ctype = storage.ctype[p.dtype],
    decls = gen.subst([[
${helpers}
${row_stats}
${softmax}
]], {
      helpers = storage.helpers(p.dtype, p.vec),
      row_stats = rowops.row_stats(p),
      softmax = rowops.depth_softmax(p.vec),
    }),
    name = name,
    abi = "cpu_mix",
    body = gen.subst([[
    const int64_t d = a->d;
    const int n = a->n, heads = a->heads;
    const int64_t hd = d / heads;
    const float inv_d = 1.0f / (float)d, eps = a->eps, scale = a->scale;
    const float alpha = a->alpha;
    float dot[heads], acc[d], weight[n * heads];
    (void)weight;
${prologue}    for (int64_t t = t0; t < t1; t++) {
        const storage_t *partial = a->partial ? (const storage_t *)a->partial + t * a->partial_stride : NULL;
        storage_t *out = (storage_t *)a->out + t * a->out_stride;
        storage_t *normed = a->normed ? (storage_t *)a->normed + t * a->normed_stride : NULL;
${body}
    }
]], {
      prologue = p.schedule == "pipelined" and prologue_pipelined() or "",
      body = body,
    }),
  }
  return src, name
end

return T
