-- lib/cuda_storage.lua: the CUDA C++ storage helpers every CUDA template
-- uses (cuda/mix_online.lua, cuda/mix_twopass.lua, cuda/phase1.lua,
-- cuda/phase2.lua). No headers needed.
--
-- A `raw_t` holds VEC storage elements as loaded (2, 4, 8 or 16 bytes):
--   raw_zero()      a raw_t of zeros (what a guarded-off load yields)
--   ld_ro(p)        read-only path (ld.global.nc): data no thread of this
--                   kernel writes (sources, o1)
--   ld_rw(p)        coherent load (ld.global): data this kernel also writes
--                   (the partial sum, which may alias out; rows this block
--                   has just stored and reads back after a barrier)
--   st_raw(p, r)    store
--   widen(r, f)     storage -> fp32
--   narrow(f)       fp32 -> storage, round to nearest even, NaN stays NaN
--   store_row(p, f) st_raw(p, narrow(f))
--   ld_f32(p, f)    VEC fp32 lanes of a query or gain vector (read-only)
--   lane_sum(v, lim), warp_sum(v)  sums over lanes by shuffles
--
-- Every load is an `asm volatile` instruction. NVRTC treats a plain load
-- (or non-volatile asm) as free of side effects, so it may hoist it above
-- the guard that keeps it inside the row (the simulator caught a lane
-- reading 16 bytes past d that way; docs/cudasim.md) or merge it with an
-- earlier load of the same address, which the re-reading schedules must
-- not have. Coherent loads and stores also clobber "memory", so the
-- compiler keeps them in program order with the stores around them.

local M = {}

M.esize = { f32 = 4, bf16 = 2, f16 = 2 }

-- Loads, the store and raw_zero for a raw_t of `bytes` bytes.
local function raw_code(bytes)
  if bytes == 2 then
    return [[
struct raw_t { ar_u16 h; };
__device__ __forceinline__ raw_t raw_zero() { raw_t r; r.h = 0; return r; }
__device__ __forceinline__ raw_t ld_ro(const st_t *p)
{ raw_t r; asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(r.h) : "l"(p)); return r; }
__device__ __forceinline__ raw_t ld_rw(const st_t *p)
{ raw_t r; asm volatile("ld.global.u16 %0, [%1];" : "=h"(r.h) : "l"(p) : "memory"); return r; }
__device__ __forceinline__ void st_raw(st_t *p, raw_t r)
{ asm volatile("st.global.u16 [%0], %1;" :: "l"(p), "h"(r.h) : "memory"); }]]
  end
  if bytes ~= 4 and bytes ~= 8 and bytes ~= 16 then
    error("cuda_storage: unsupported load width " .. bytes)
  end
  local nw = bytes // 4
  local regs, outs, ins, st_list = {}, {}, {}, {}
  for i = 0, nw - 1 do
    regs[#regs + 1] = "%" .. i
    outs[#outs + 1] = string.format('"=r"(r.w[%d])', i)
    ins[#ins + 1] = string.format('"r"(r.w[%d])', i)
    st_list[#st_list + 1] = "%" .. (i + 1)
  end
  return gen.subst([[
struct alignas(${BYTES}) raw_t { ar_u32 w[${NW}]; };
__device__ __forceinline__ raw_t raw_zero()
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < ${NW}; i++)
        r.w[i] = 0u;
    return r;
}
__device__ __forceinline__ raw_t ld_ro(const st_t *p)
{ raw_t r; asm volatile("ld.global.nc.${SUF} ${REGS}, [${P}];" : ${OUTS} : "l"(p)); return r; }
__device__ __forceinline__ raw_t ld_rw(const st_t *p)
{ raw_t r; asm volatile("ld.global.${SUF} ${REGS}, [${P}];" : ${OUTS} : "l"(p) : "memory"); return r; }
__device__ __forceinline__ void st_raw(st_t *p, raw_t r)
{ asm volatile("st.global.${SUF} [%0], ${SREGS};" :: "l"(p), ${INS} : "memory"); }]], {
    NW = nw, BYTES = bytes,
    SUF = nw == 1 and "u32" or string.format("v%d.u32", nw),
    REGS = nw == 1 and "%0" or "{" .. table.concat(regs, ", ") .. "}",
    OUTS = table.concat(outs, ", "),
    P = "%" .. nw,
    INS = table.concat(ins, ", "),
    SREGS = nw == 1 and "%1" or "{" .. table.concat(st_list, ", ") .. "}",
  })
end

-- widen() and narrow() for the dtype.
local function convert_code(dtype, vec)
  if dtype == "f32" then
    return [[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC; i++)
        f[i] = __uint_as_float(r.w[i]);
}
__device__ __forceinline__ raw_t narrow(const float (&f)[VEC])
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < VEC; i++)
        r.w[i] = __float_as_uint(f[i]);
    return r;
}]]
  end
  local L = {}
  if dtype == "bf16" then
    -- bf16 -> fp32 is a shift, so widen() works on the packed words.
    L[#L + 1] = [[
/* fp32 -> bf16 rounds to nearest even, NaN stays NaN. */
__device__ __forceinline__ ar_u32 bf16_bits(float x)
{
#if __CUDA_ARCH__ >= 800
    ar_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    const ar_u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
#endif
}
__device__ __forceinline__ ar_u32 bf16x2_bits(float lo, float hi)
{
#if __CUDA_ARCH__ >= 800
    ar_u32 w;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
#else
    return bf16_bits(lo) | (bf16_bits(hi) << 16);
#endif
}]]
    if vec == 1 then
      L[#L + 1] = [[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{ f[0] = __uint_as_float((ar_u32)r.h << 16); }
__device__ __forceinline__ raw_t narrow(const float (&f)[VEC])
{ raw_t r; r.h = (ar_u16)bf16_bits(f[0]); return r; }]]
    else
      L[#L + 1] = [[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC / 2; i++) {
        f[2 * i] = __uint_as_float(r.w[i] << 16);
        f[2 * i + 1] = __uint_as_float(r.w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ raw_t narrow(const float (&f)[VEC])
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < VEC / 2; i++)
        r.w[i] = bf16x2_bits(f[2 * i], f[2 * i + 1]);
    return r;
}]]
    end
  else -- f16
    L[#L + 1] = [[
__device__ __forceinline__ float f16_float(ar_u16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ ar_u16 f16_bits(float x)
{
    ar_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}]]
    if vec == 1 then
      L[#L + 1] = [[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC]) { f[0] = f16_float(r.h); }
__device__ __forceinline__ raw_t narrow(const float (&f)[VEC]) { raw_t r; r.h = f16_bits(f[0]); return r; }]]
    else
      L[#L + 1] = [[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC / 2; i++) {
        f[2 * i] = f16_float((ar_u16)(r.w[i] & 0xffffu));
        f[2 * i + 1] = f16_float((ar_u16)(r.w[i] >> 16));
    }
}
__device__ __forceinline__ raw_t narrow(const float (&f)[VEC])
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < VEC / 2; i++)
        r.w[i] = (ar_u32)f16_bits(f[2 * i]) | ((ar_u32)f16_bits(f[2 * i + 1]) << 16);
    return r;
}]]
    end
  end
  return table.concat(L, "\n")
end

-- ld_f32: VEC fp32 lanes in loads of at most 16 bytes (the launch data's
-- qalign, min(4 * VEC, 16), is what makes the vector loads legal).
local function f32_code(vec)
  local fl = {}
  local step = math.min(vec, 4)
  for base = 0, vec - 1, step do
    if step == 1 then
      fl[#fl + 1] = string.format('    asm volatile("ld.global.nc.f32 %%0, [%%1];" : "=f"(f[%d]) : "l"(p + %d));', base, base)
    else
      local regs, outs = {}, {}
      for i = 0, step - 1 do
        regs[#regs + 1] = "%" .. i
        outs[#outs + 1] = string.format('"=f"(f[%d])', base + i)
      end
      fl[#fl + 1] = string.format('    asm volatile("ld.global.nc.v%d.f32 {%s}, [%%%d];" : %s : "l"(p + %d));',
                                  step, table.concat(regs, ", "), step, table.concat(outs, ", "), base)
    end
  end
  return "/* fp32 lanes of a query or gain vector (read-only) */\n" ..
    "__device__ __forceinline__ void ld_f32(const float *p, float (&f)[VEC])\n{\n" ..
    table.concat(fl, "\n") .. "\n}"
end

function M.code(dtype, vec)
  local bytes = vec * M.esize[dtype]
  return table.concat({
    [[
typedef unsigned short ar_u16;
typedef unsigned int ar_u32;
typedef long long ar_i64;]],
    string.format("typedef %s st_t;", dtype == "f32" and "float" or "ar_u16"),
    string.format("constexpr int VEC = %d;", vec),
    raw_code(bytes),
    convert_code(dtype, vec),
    [[
__device__ __forceinline__ void store_row(st_t *p, const float (&f)[VEC]) { st_raw(p, narrow(f)); }]],
    f32_code(vec),
    [[
/* Sum over the lanes whose xor distance is below lim (lim a power of two;
 * 32 or more: the whole warp). Every lane takes part in every shuffle. */
__device__ __forceinline__ float lane_sum(float v, int lim)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        if (off < lim)
            v += o;
    }
    return v;
}
/* Sum over the whole warp. */
__device__ __forceinline__ float warp_sum(float v) { return lane_sum(v, 32); }]],
  }, "\n")
end

return M
