# Unit tests of the kernel generator (gen/). Included from
# tests/CMakeLists.txt.

# gen/: throwaway templates in a temp dir, plus the real templates/ read
# through an absolute path (independent of ATTNRES_TEMPLATE_DIR at run time).
attnres_unit_test(gen_unit test_gen.c TIMEOUT 120 LABEL gen TEMPLATES LIBS argen)

# The generated bf16 stores round to nearest even on each path they take
# (AVX512-BF16's instruction and the portable rounding), compiled with the
# host compiler as the CPU backend compiles variants.
attnres_unit_test(gen_bf16_rounding test_bf16_rounding.c TIMEOUT 120 LABEL gen TEMPLATES LIBS argen)
target_compile_definitions(test_bf16_rounding PRIVATE HOST_CC="${CMAKE_C_COMPILER}")
