-- lib/c_mix_abi.lua: the argument struct of every generated CPU mix kernel
-- (cpu/mix.lua, cpu/mix_fused.lua). Each kernel carries its own copy so that
-- it compiles alone; runtime/src/cpu_kernel_abi.h declares the same struct
-- and the runtime refuses a kernel whose `<name>_abi` differs.

return [[
/* Kernel arguments, ABI version 1: must match runtime/src/cpu_kernel_abi.h.
 * Strides count elements. */
struct attnres_cpu_mix_args {
    int64_t d;
    int32_t n, heads;
    const void *const *src;
    const int64_t *src_stride;
    const float *query;
    float scale, eps;
    const void *partial;
    int64_t partial_stride;
    float alpha;
    void *out;
    int64_t out_stride;
    const float *out_gain;
    float out_eps;
    void *normed;
    int64_t normed_stride;
};
]]
