-- lib/c_storage.lua: C text for loading and storing rows of a storage dtype
-- as fp32 vectors of `vec` lanes (GNU vector extensions), shared by the CPU
-- templates. All arithmetic happens in fp32; storage may be f32, bf16, f16.

local M = {}

-- f16 rows are kept as their bits (uint16_t) so that the hardware
-- conversions (F16C, AVX-512) can load them; GCC 12 turns conversions of
-- _Float16 vectors into one scalar instruction per lane.
M.ctype = { f32 = "float", bf16 = "uint16_t", f16 = "uint16_t" }
M.size = { f32 = 4, bf16 = 2, f16 = 2 } -- bytes per element

-- hsum(x): the sum of a vector's lanes. A tree of log2(vec) shuffles and
-- adds: summed lane by lane, the adds form one dependent chain of vec, and
-- a kernel sums a vector per row and head of every token.
local function hsum(vec)
  if vec == 1 then
    return "static inline float hsum(vf x) { return x[0]; }\n"
  end
  local steps = {}
  local half = vec // 2
  while half >= 1 do
    local idx = {}
    for i = 0, vec - 1 do idx[#idx + 1] = tostring((i + half) % vec) end
    steps[#steps + 1] = string.format("    x += SHUFFLE(x, %s);\n", table.concat(idx, ", "))
    half = half // 2
  end
  return gen.subst([[
/* Lane permutations: GCC's builtin takes a mask vector, Clang's the indices.
 * SHUFFLE2's index i < ${VEC} picks x's lane i, else y's lane i - ${VEC}. */
#if defined(__clang__)
#define SHUFFLE(x, ...) __builtin_shufflevector(x, x, __VA_ARGS__)
#define SHUFFLE2(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define SHUFFLE(x, ...) __builtin_shuffle(x, (vi){__VA_ARGS__})
#define SHUFFLE2(x, y, ...) __builtin_shuffle(x, y, (vi){__VA_ARGS__})
#endif

/* The sum of the lanes, as a tree: log2(${VEC}) adds deep, not ${VEC}. */
static inline float hsum(vf x)
{
${steps}    return x[0];
}
]], { VEC = vec, steps = table.concat(steps) })
end

-- Vector typedefs and the load/store helpers for one dtype and width.
function M.helpers(dtype, vec)
  local v = { VEC = vec, BYTES4 = vec * 4, BYTES2 = vec * 2, hsum = hsum(vec) }
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

${hsum}]], v)
  if dtype == "f32" then
    text = text .. [[

static inline vf load_row(const float *p) { return load_f32(p); }
static inline void store_row(float *p, vf x) { store_f32(p, x); }
]]
  elseif dtype == "bf16" then
    local wide = {
      [16] = { isa = "__AVX512F__", itype = "__m512i",
               load = "_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16)" },
      [8] = { isa = "__AVX2__", itype = "__m256i",
              load = "_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16)" },
    }
    local w = wide[vec]
    v.FAST_LOAD = w and gen.subst([[
#if defined(${ISA})
    const ${ITYPE} wide = ${LOAD};
    vf x;
    memcpy(&x, &wide, sizeof x);
    return x;
#else
]], { ISA = w.isa, ITYPE = w.itype, LOAD = w.load }) or ""
    v.END = w and "\n#endif" or ""
    -- AVX512-BF16 rounds a vector in one instruction where bf16_bits takes
    -- a dozen (GCC 12, -O3); in phase 2, which stores two rows for every
    -- three it loads, that arithmetic had kept the loop a quarter below the
    -- memory's pace (docs/cpu_kernels.md).
    local round = {
      [16] = { isa = "defined(__AVX512BF16__)", ftype = "__m512", htype = "__m256bh",
               round = "_mm512_cvtneps_pbh" },
      [8] = { isa = "defined(__AVX512BF16__) && defined(__AVX512VL__)", ftype = "__m256",
              htype = "__m128bh", round = "_mm256_cvtneps_pbh" },
    }
    local r = round[vec]
    v.FAST_STORE = r and gen.subst([[
#if ${ISA}
    ${FTYPE} f;
    memcpy(&f, &x, sizeof f);
    const ${HTYPE} h = ${ROUND}(f);
    memcpy(p, &h, sizeof h);
#else
]], { ISA = r.isa, FTYPE = r.ftype, HTYPE = r.htype, ROUND = r.round }) or ""
    v.STORE_END = r and "\n#endif" or ""
    text = (w and "#include <immintrin.h>\n\n" or "") .. text .. gen.subst([[

typedef uint16_t vh __attribute__((vector_size(${BYTES2})));

/* bf16 is the high half of an fp32: widening is a zero-extension and a
 * shift (written with intrinsics where GCC would split the vector). */
static inline vf load_row(const uint16_t *p)
{
${FAST_LOAD}    vh h;
    memcpy(&h, p, sizeof h);
    vu w = __builtin_convertvector(h, vu) << 16;
    vf x;
    memcpy(&x, &w, sizeof x);
    return x;${END}
}

/* x rounded to nearest even at bf16 precision, its bits in the high half of
 * each lane and garbage below; NaN stays NaN (quiet) instead of rounding to
 * Inf: its bias is zero and its top mantissa bit set, the low half being
 * cut off either way. AVX512-BF16's rounding instruction, used where the ISA
 * has it, gives the same bits except that it flushes subnormals (below
 * 1.2e-38) to zero. Nine operations a vector where a select of two results
 * took twelve: the store is a quarter of the mix's time on AVX2
 * (docs/cpu_kernels.md). */
static inline vu bf16_rounded(vf x)
{
    vu w;
    memcpy(&w, &x, sizeof w);
    const vu nan = (vu)(x != x);
    const vu bias = (0x7fffu + ((w >> 16) & 1u)) & ~nan;
    return (w | (nan & 0x400000u)) + bias;
}

/* The bf16 bits of x in the low half of each lane. */
static inline vu bf16_bits(vf x)
{
    return bf16_rounded(x) >> 16;
}

static inline void store_row(uint16_t *p, vf x)
{
${FAST_STORE}    vh h = __builtin_convertvector(bf16_bits(x), vh);
    memcpy(p, &h, sizeof h);${STORE_END}
}
]], v)
  elseif dtype == "f16" then
    local wide = {
      [16] = { isa = "__AVX512F__", ftype = "__m512",
               load = "_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p))",
               store = "_mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))" },
      [8] = { isa = "__F16C__", ftype = "__m256",
              load = "_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p))",
              store = "_mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT))" },
    }
    local w = wide[vec]
    local fast_load, fast_store = "", ""
    if w then
      fast_load = gen.subst([[
#if defined(${ISA})
    const ${FTYPE} f = ${LOAD};
    vf x;
    memcpy(&x, &f, sizeof x);
    return x;
#else
]], { ISA = w.isa, FTYPE = w.ftype, LOAD = w.load })
      fast_store = gen.subst([[
#if defined(${ISA})
    ${FTYPE} f;
    memcpy(&f, &x, sizeof f);
    ${STORE};
#else
]], { ISA = w.isa, FTYPE = w.ftype, STORE = w.store })
    end
    text = "#include <immintrin.h>\n\n" .. text .. gen.subst([[

/* f16 rows: the hardware conversion where the ISA has one, else lane by
 * lane through _Float16 (round to nearest even either way). */
static inline vf load_row(const uint16_t *p)
{
${FAST_LOAD}    vf x;
    for (int i = 0; i < ${VEC}; i++) {
        _Float16 h;
        memcpy(&h, p + i, sizeof h);
        x[i] = (float)h;
    }
    return x;${END}
}

static inline void store_row(uint16_t *p, vf x)
{
${FAST_STORE}    for (int i = 0; i < ${VEC}; i++) {
        _Float16 h = (_Float16)x[i];
        memcpy(p + i, &h, sizeof h);
    }${END}
}
]], { VEC = vec, FAST_LOAD = fast_load, FAST_STORE = fast_store, END = w and "\n#endif" or "" })
  else
    error("unknown dtype " .. tostring(dtype), 2)
  end
  return text
end

-- Pair helpers: load_pair/store_pair move 2 * vec elements as two fp32
-- vectors, lo and hi, in an order chosen per dtype so that widening is
-- cheapest; pair_order() permutes an fp32 row (the query, a gain) into the
-- same order, so lane-wise products pair the right elements, and
-- pair_unorder() puts such a row back in row order; load_pair_f32 and
-- store_pair_f32 move 2 * vec elements of an fp32 row kept in row order (a
-- gradient the caller takes in fp32) as a pair. Reductions and lane-wise
-- mixes do not care about the order.
--   f32, f16: lo holds elements [0, vec), hi holds [vec, 2 * vec).
--   bf16: one 32-bit word holds two bf16 (little-endian: the even element in
--     the low half), so lo = word << 16 holds the even elements and
--     hi = word & 0xffff0000 the odd ones: two integer operations widen
--     2 * vec elements, with no shuffles.
function M.pair_helpers(dtype, vec)
  local v = { VEC = vec, FAST_STORE = "", END = "" }
  -- The shuffle indices (of two vectors, the second's lanes from vec on)
  -- that split fp32 rows into even and odd elements and interleave them
  -- back: the first half of the row, then the second.
  local even, odd, first, second = {}, {}, {}, {}
  for j = 0, vec - 1 do
    even[#even + 1], odd[#odd + 1] = tostring(2 * j), tostring(2 * j + 1)
    local half = j // 2 + (j % 2) * vec
    first[#first + 1], second[#second + 1] = tostring(half), tostring(half + vec // 2)
  end
  v.EVEN, v.ODD = table.concat(even, ", "), table.concat(odd, ", ")
  v.FIRST, v.SECOND = table.concat(first, ", "), table.concat(second, ", ")
  -- AVX512-BF16 rounds both vectors in one instruction (lo into the low
  -- half of the result, hi into the high half) and AVX512-BW's word
  -- permutation interleaves them: two instructions, where rounding each
  -- and widening it back took six.
  local wide = {
    [16] = { isa = "defined(__AVX512BF16__) && defined(__AVX512BW__)", ftype = "__m512",
             itype = "__m512i", round2 = "_mm512_cvtne2ps_pbh", permute = "_mm512_permutexvar_epi16",
             set = "_mm512_set_epi16" },
    [8] = { isa = "defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)",
            ftype = "__m256", itype = "__m256i", round2 = "_mm256_cvtne2ps_pbh",
            permute = "_mm256_permutexvar_epi16", set = "_mm256_set_epi16" },
  }
  local w = wide[vec]
  if dtype == "bf16" and w then
    -- Word j of the row is lo's j / 2 when j is even, else hi's (at vec +
    -- j / 2 of the rounded pair); the set intrinsic lists the last first.
    local order = {}
    for j = 2 * vec - 1, 0, -1 do
      order[#order + 1] = tostring(j % 2 == 0 and j // 2 or vec + j // 2)
    end
    v.FAST_STORE = gen.subst([[
#if ${ISA}
    ${FTYPE} l, h;
    memcpy(&l, &lo, sizeof l);
    memcpy(&h, &hi, sizeof h);
    const ${ITYPE} order = ${SET}(${ORDER});
    const ${ITYPE} w = ${PERMUTE}(order, (${ITYPE})${ROUND2}(h, l));
    memcpy(p, &w, sizeof w);
${AVX2}#else
]], { ISA = w.isa, FTYPE = w.ftype, ITYPE = w.itype, SET = w.set, ORDER = table.concat(order, ", "),
      PERMUTE = w.permute, ROUND2 = w.round2, AVX2 = vec == 8 and [[
#elif defined(__AVX2__)
    /* bf16_rounded's bits, with its NaN case apart (one test a pair, a
     * branch never taken without NaN) and the two halves joined by a word
     * blend: 13 operations where the portable code below takes 19, in
     * loops that store a pair for every two or three they load
     * (cpu/mix_backward.lua). */
    __m256 l, h;
    memcpy(&l, &lo, sizeof l);
    memcpy(&h, &hi, sizeof h);
    const __m256i wl = _mm256_castps_si256(l), wh = _mm256_castps_si256(h);
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i quiet = _mm256_set1_epi32(0x400000);
    __m256i rl = _mm256_add_epi32(_mm256_add_epi32(wl, bias), _mm256_and_si256(_mm256_srli_epi32(wl, 16), one));
    __m256i rh = _mm256_add_epi32(_mm256_add_epi32(wh, bias), _mm256_and_si256(_mm256_srli_epi32(wh, 16), one));
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(l, h, _CMP_UNORD_Q)) != 0, 0)) {
        /* A NaN stays one, made quiet, instead of rounding to Inf. */
        rl = _mm256_blendv_epi8(rl, _mm256_or_si256(wl, quiet), _mm256_castps_si256(_mm256_cmp_ps(l, l, _CMP_UNORD_Q)));
        rh = _mm256_blendv_epi8(rh, _mm256_or_si256(wh, quiet), _mm256_castps_si256(_mm256_cmp_ps(h, h, _CMP_UNORD_Q)));
    }
    const __m256i w = _mm256_blend_epi16(_mm256_srli_epi32(rl, 16), rh, 0xaa);
    memcpy(p, &w, sizeof w);
]] or "" })
    v.END = "\n#endif"
  end
  if dtype == "bf16" then
    return gen.subst([[

/* Widens 2 * ${VEC} bf16 into the even (lo) and odd (hi) elements. */
static inline void load_pair(const uint16_t *p, vf *lo, vf *hi)
{
    vu w;
    memcpy(&w, p, sizeof w);
    vu even = w << 16, odd = w & 0xffff0000u;
    memcpy(lo, &even, sizeof even);
    memcpy(hi, &odd, sizeof odd);
}

/* Rounds the even (lo) and odd (hi) elements and interleaves them back
 * (with AVX512-BF16's rounding instruction where the ISA has it). */
static inline void store_pair(uint16_t *p, vf lo, vf hi)
{
${FAST_STORE}    vu w = bf16_bits(lo) | (bf16_rounded(hi) & 0xffff0000u);
    memcpy(p, &w, sizeof w);${END}
}

/* Reorders x[0, d) as load_pair orders a row: per block of 2 * ${VEC}, the
 * even elements, then the odd ones. */
static void pair_order(const float *x, float *xp, int64_t d)
{
    for (int64_t b = 0; b < d; b += 2 * ${VEC})
        for (int j = 0; j < ${VEC}; j++) {
            xp[b + j] = x[b + 2 * j];
            xp[b + ${VEC} + j] = x[b + 2 * j + 1];
        }
}

/* The inverse of pair_order: xp in pair order back to row order in x. */
static void pair_unorder(const float *xp, float *x, int64_t d)
{
    for (int64_t b = 0; b < d; b += 2 * ${VEC})
        for (int j = 0; j < ${VEC}; j++) {
            x[b + 2 * j] = xp[b + j];
            x[b + 2 * j + 1] = xp[b + ${VEC} + j];
        }
}

/* 2 * ${VEC} elements of an fp32 row (in row order) as a pair: the even
 * elements (lo) and the odd ones (hi), and back. */
static inline void load_pair_f32(const float *p, vf *lo, vf *hi)
{
    const vf x = load_f32(p), y = load_f32(p + ${VEC});
    *lo = SHUFFLE2(x, y, ${EVEN});
    *hi = SHUFFLE2(x, y, ${ODD});
}

static inline void store_pair_f32(float *p, vf lo, vf hi)
{
    store_f32(p, SHUFFLE2(lo, hi, ${FIRST}));
    store_f32(p + ${VEC}, SHUFFLE2(lo, hi, ${SECOND}));
}
]], v)
  end
  return gen.subst([[

/* 2 * ${VEC} elements as two vectors in row order. */
static inline void load_pair(const storage_t *p, vf *lo, vf *hi)
{
    *lo = load_row(p);
    *hi = load_row(p + ${VEC});
}

static inline void store_pair(storage_t *p, vf lo, vf hi)
{
    store_row(p, lo);
    store_row(p + ${VEC}, hi);
}

/* Row order is already the pair order. */
static void pair_order(const float *x, float *xp, int64_t d)
{
    memcpy(xp, x, (size_t)d * sizeof *xp);
}

static void pair_unorder(const float *xp, float *x, int64_t d)
{
    memcpy(x, xp, (size_t)d * sizeof *x);
}

static inline void load_pair_f32(const float *p, vf *lo, vf *hi)
{
    *lo = load_f32(p);
    *hi = load_f32(p + ${VEC});
}

static inline void store_pair_f32(float *p, vf lo, vf hi)
{
    store_f32(p, lo);
    store_f32(p + ${VEC}, hi);
}
]], v)
end

-- Non-temporal stores (cpu/phase1.lua, cpu/phase2.lua, cpu/mix_fused.lua):
-- an output row that nothing reads soon goes to memory through the
-- write-combining buffers, without first being read into the cache (the
-- read-for-ownership that makes a plain store of a fresh line cost a read
-- and a write). stream_row(p, x) stores one vector as store_row does and
-- stream_pair(p, lo, hi) two as store_pair does, each past the caches where
-- p is aligned to the bytes it stores (at most 64 per instruction), and
-- with a plain store otherwise; without x86's non-temporal stores (not
-- x86-64), plain stores. stream_fence() orders them before what follows:
-- they are weakly ordered, unlike plain stores. stream_pair comes with
-- `pairs` (after pair_helpers).
function M.stream_helpers(vec, pairs)
  local pair = pairs and [[

static inline void stream_pair(storage_t *p, vf lo, vf hi)
{
    storage_t line[2 * ${VEC}] __attribute__((aligned(64)));
    if (!streamable(p, sizeof line)) {
        store_pair(p, lo, hi);
        return;
    }
    store_pair(line, lo, hi);
    stream_copy(p, line, sizeof line);
}
]] or ""
  return gen.subst([[

#if defined(__SSE2__)
#include <immintrin.h>
#endif

/* Copies n bytes (a multiple of 16) from src to dst with non-temporal
 * stores of the widest vector that fits; dst aligned to min(n, 64). */
static inline void stream_copy(void *dst, const void *src, size_t n)
{
#if defined(__SSE2__)
    char *d = dst;
    const char *s = src;
#if defined(__AVX512F__)
    for (; n >= 64; n -= 64, d += 64, s += 64)
        _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
#endif
#if defined(__AVX__)
    for (; n >= 32; n -= 32, d += 32, s += 32)
        _mm256_stream_si256((__m256i *)(void *)d, _mm256_loadu_si256((const __m256i *)(const void *)s));
#endif
    for (; n >= 16; n -= 16, d += 16, s += 16)
        _mm_stream_si128((__m128i *)(void *)d, _mm_loadu_si128((const __m128i *)(const void *)s));
#else
    memcpy(dst, src, n);
#endif
}

/* True when p is aligned for stream_copy of n bytes (and n can be). */
static inline int streamable(const void *p, size_t n)
{
#if defined(__SSE2__)
    const size_t align = n < 64 ? n : 64;
    return n % 16 == 0 && (uintptr_t)p % align == 0;
#else
    (void)p, (void)n;
    return 0;
#endif
}

static inline void stream_row(storage_t *p, vf x)
{
    storage_t line[${VEC}] __attribute__((aligned(64)));
    if (!streamable(p, sizeof line)) {
        store_row(p, x);
        return;
    }
    store_row(line, x);
    stream_copy(p, line, sizeof line);
}
${pair}
static inline void stream_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}
]], { VEC = vec, pair = gen.subst(pair, { VEC = vec }) })
end

-- The calls that store one vector `x`, or the pair `lo`, `hi`, at `dst`
-- (each a line of C at `indent`): past the caches where `stream` is true
-- (stream_helpers), with plain stores otherwise.
function M.store_row_call(stream, dst, x, indent)
  return string.format("%s%s(%s, %s);\n", indent, stream and "stream_row" or "store_row", dst, x)
end

function M.store_pair_call(stream, dst, lo, hi, indent)
  return string.format("%s%s(%s, %s, %s);\n", indent, stream and "stream_pair" or "store_pair", dst, lo, hi)
end

-- lane_sums(v, count, out): out[i] = the sum of v[i]'s lanes, for count
-- vectors. A kernel that sums many vectors at once (phase 1's tiles of dot
-- products: 24 per tile and head, for each of MHAR's 8 heads) pays
-- log2(vec) shuffles and adds for each with hsum(). Summed vec at a time,
-- the vectors transpose into one whose lane i holds v[i]'s sum, in log2(vec)
-- levels that each halve the vector count: 2 * (vec - 1) two-source
-- shuffles and vec - 1 adds for vec sums (16 lanes: 45 operations where
-- hsum() takes 128). A level with blocks of b lanes pairs u[i] with
-- u[i + m/2]: one shuffle takes the even-numbered blocks of both, the
-- other the odd-numbered ones, each in the other's places, so their sum
-- holds, in blocks of b lanes that alternate between the two, partial sums
-- of both; the next level halves b. (The fused mix's per-head sums, 81 a
-- token at MHAR's shape, gained nothing from it: they are off its critical
-- path, bench/results/cpu-tune-2026-12-05.md.) Its shuffles are the
-- helpers' SHUFFLE2.
function M.lane_sums(vec)
  local levels = {}
  local block, m = vec // 2, vec
  while block >= 1 do
    local lo, hi = {}, {}
    for lane = 0, vec - 1 do
      local b, r = lane // block, lane % block
      local from_b = b % 2 == 1 and vec or 0
      lo[#lo + 1] = tostring(from_b + (b - b % 2) * block + r)
      hi[#hi + 1] = tostring(from_b + (b - b % 2 + 1) * block + r)
    end
    levels[#levels + 1] = gen.subst([[
    for (int i = 0; i < ${HALF}; i++)
        u[i] = SHUFFLE2(u[i], u[i + ${HALF}], ${LO}) +
               SHUFFLE2(u[i], u[i + ${HALF}], ${HI});
]], { HALF = m // 2, LO = table.concat(lo, ", "), HI = table.concat(hi, ", ") })
    block, m = block // 2, m // 2
  end
  return gen.subst([[
/* The ${VEC} vectors at v summed lane-wise into one: lane i holds the sum of
 * v[i]'s lanes. */
static inline vf transpose_sum(const vf *v)
{
    vf u[${VEC}];
    for (int i = 0; i < ${VEC}; i++)
        u[i] = v[i];
${levels}    return u[0];
}

/* out[i] = the sum of v[i]'s lanes for i < count, ${VEC} at a time; the last
 * group is padded with zero vectors. */
static inline void lane_sums(const vf *v, int count, float *out)
{
    int i = 0;
    for (; i + ${VEC} <= count; i += ${VEC})
        store_f32(out + i, transpose_sum(v + i));
    if (i < count) {
        vf pad[${VEC}];
        for (int j = 0; j < ${VEC}; j++)
            pad[j] = i + j < count ? v[i + j] : (vf){0};
        const vf sum = transpose_sum(pad);
        memcpy(out + i, &sum, (size_t)(count - i) * sizeof *out);
    }
}
]], { VEC = vec, levels = table.concat(levels) })
end

return M
