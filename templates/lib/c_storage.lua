-- lib/c_storage.lua: C text for loading and storing rows of a storage dtype
-- as fp32 vectors of `vec` lanes (GNU vector extensions), shared by the CPU
-- templates. All arithmetic happens in fp32; storage may be f32, bf16, f16.

local M = {}

M.ctype = { f32 = "float", bf16 = "uint16_t", f16 = "_Float16" }

-- Vector typedefs and the load/store helpers for one dtype and width.
function M.helpers(dtype, vec)
  local v = { VEC = vec, BYTES4 = vec * 4, BYTES2 = vec * 2 }
  local text = gen.subst([[
/* fp32 vectors of ${VEC} lane(s); loads and stores go through memcpy so that
 * rows need no particular alignment. */
typedef float vf __attribute__((vector_size(${BYTES4})));
typedef uint32_t vu __attribute__((vector_size(${BYTES4})));
typedef int32_t vi __attribute__((vector_size(${BYTES4})));

static inline vf load_f32(const float *p)
{
    vf x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store_f32(float *p, vf x) { memcpy(p, &x, sizeof x); }

static inline float hsum(vf x)
{
    float s = 0.0f;
    for (int i = 0; i < ${VEC}; i++)
        s += x[i];
    return s;
}
]], v)
  if dtype == "f32" then
    text = text .. [[

static inline vf load_row(const float *p) { return load_f32(p); }
static inline void store_row(float *p, vf x) { store_f32(p, x); }
]]
  elseif dtype == "bf16" then
    text = text .. gen.subst([[

typedef uint16_t vh __attribute__((vector_size(${BYTES2})));

/* bf16 is the high half of an fp32: widening is a shift. */
static inline vf load_row(const uint16_t *p)
{
    vh h;
    memcpy(&h, p, sizeof h);
    vu w = __builtin_convertvector(h, vu) << 16;
    vf x;
    memcpy(&x, &w, sizeof x);
    return x;
}

/* Rounds to nearest even; NaN stays NaN (quiet) instead of rounding to Inf. */
static inline void store_row(uint16_t *p, vf x)
{
    vu w;
    memcpy(&w, &x, sizeof w);
    vu rounded = (w + 0x7fffu + ((w >> 16) & 1u)) >> 16;
    vu nan = (vu)((w & 0x7fffffffu) > 0x7f800000u);
    vu quiet = (w >> 16) | 0x40u;
    vh h = __builtin_convertvector((quiet & nan) | (rounded & ~nan), vh);
    memcpy(p, &h, sizeof h);
}
]], v)
  elseif dtype == "f16" then
    text = text .. gen.subst([[

typedef _Float16 vh __attribute__((vector_size(${BYTES2})));

static inline vf load_row(const _Float16 *p)
{
    vh h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, vf);
}

static inline void store_row(_Float16 *p, vf x)
{
    vh h = __builtin_convertvector(x, vh);
    memcpy(p, &h, sizeof h);
}
]], v)
  else
    error("unknown dtype " .. tostring(dtype), 2)
  end
  return text
end

return M
