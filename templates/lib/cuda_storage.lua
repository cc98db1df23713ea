-- lib/cuda_storage.lua: CUDA C++ storage helpers shared by the Block AttnRes
-- phase templates (cuda/phase1.lua, cuda/phase2.lua). No headers needed.
--
-- A `raw_t` holds VEC storage elements as loaded (2..16 bytes):
--   ld_ro(p)     read-only path (__ldg): inputs this kernel never writes
--   ld_rw(p)     coherent load: data this kernel also writes (the partial sum)
--   st_raw(p, r) store
--   widen(r, f)  storage -> fp32; narrow(f) fp32 -> storage (round to nearest
--                even, NaN stays NaN)
--   ld_f32(p, f) VEC fp32 lanes of a query or gain vector (read-only)

local M = {}

M.esize = { f32 = 4, bf16 = 2, f16 = 2 }

function M.code(dtype, vec)
  local es = M.esize[dtype]
  local bytes = vec * es
  local L = {}
  local function add(s) L[#L + 1] = s end
  add([[
typedef unsigned short ar_u16;
typedef unsigned int ar_u32;
typedef long long ar_i64;]])
  add(string.format("typedef %s st_t;", dtype == "f32" and "float" or "ar_u16"))
  add(string.format("constexpr int VEC = %d;", vec))
  if bytes == 2 then
    add([[
struct raw_t { ar_u16 h; };
__device__ __forceinline__ raw_t ld_ro(const st_t *p) { raw_t r; r.h = __ldg((const ar_u16 *)p); return r; }
__device__ __forceinline__ raw_t ld_rw(const st_t *p) { raw_t r; r.h = *(const ar_u16 *)p; return r; }
__device__ __forceinline__ void st_raw(st_t *p, raw_t r) { *(ar_u16 *)p = r.h; }]])
  elseif bytes == 4 then
    add([[
struct raw_t { ar_u32 w[1]; };
__device__ __forceinline__ raw_t ld_ro(const st_t *p) { raw_t r; r.w[0] = __ldg((const ar_u32 *)p); return r; }
__device__ __forceinline__ raw_t ld_rw(const st_t *p) { raw_t r; r.w[0] = *(const ar_u32 *)p; return r; }
__device__ __forceinline__ void st_raw(st_t *p, raw_t r) { *(ar_u32 *)p = r.w[0]; }]])
  elseif bytes == 16 then
    add([[
struct raw_t { ar_u32 w[4]; };
__device__ __forceinline__ raw_t ld_ro(const st_t *p)
{
    const uint4 u = __ldg((const uint4 *)p);
    raw_t r;
    r.w[0] = u.x, r.w[1] = u.y, r.w[2] = u.z, r.w[3] = u.w;
    return r;
}
__device__ __forceinline__ raw_t ld_rw(const st_t *p)
{
    const uint4 u = *(const uint4 *)p;
    raw_t r;
    r.w[0] = u.x, r.w[1] = u.y, r.w[2] = u.z, r.w[3] = u.w;
    return r;
}
__device__ __forceinline__ void st_raw(st_t *p, raw_t r)
{
    *(uint4 *)p = make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
}]])
  else
    error("cuda_storage: unsupported load width " .. bytes)
  end

  if dtype == "f32" then
    add([[
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
}]])
  else
    if dtype == "bf16" then
      add([[
__device__ __forceinline__ float h_float(ar_u16 h) { return __uint_as_float((ar_u32)h << 16); }
__device__ __forceinline__ ar_u16 h_bits(float x)
{
#if __CUDA_ARCH__ >= 800
    ar_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    const ar_u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ar_u16)((u >> 16) | 0x40u);
    return (ar_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}]])
    else
      add([[
__device__ __forceinline__ float h_float(ar_u16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ ar_u16 h_bits(float x)
{
    ar_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}]])
    end
    if vec == 1 then
      add([[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC]) { f[0] = h_float(r.h); }
__device__ __forceinline__ raw_t narrow(const float (&f)[VEC]) { raw_t r; r.h = h_bits(f[0]); return r; }]])
    else
      add([[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC / 2; i++) {
        f[2 * i] = h_float((ar_u16)(r.w[i] & 0xffffu));
        f[2 * i + 1] = h_float((ar_u16)(r.w[i] >> 16));
    }
}
__device__ __forceinline__ raw_t narrow(const float (&f)[VEC])
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < VEC / 2; i++)
        r.w[i] = (ar_u32)h_bits(f[2 * i]) | ((ar_u32)h_bits(f[2 * i + 1]) << 16);
    return r;
}]])
    end
  end

  -- fp32 lanes: float4 loads when VEC is a multiple of 4, else scalars.
  if vec % 4 == 0 then
    add([[
__device__ __forceinline__ void ld_f32(const float *p, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC / 4; i++) {
        const float4 v = __ldg((const float4 *)p + i);
        f[4 * i] = v.x, f[4 * i + 1] = v.y, f[4 * i + 2] = v.z, f[4 * i + 3] = v.w;
    }
}]])
  else
    add([[
__device__ __forceinline__ void ld_f32(const float *p, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC; i++)
        f[i] = __ldg(p + i);
}]])
  end
  add([[
/* Sum over the whole warp; every lane takes part. */
__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}]])
  return table.concat(L, "\n")
end

return M
