# Unit tests of the kernel generator (gen/) and of the public runtime API
# (runtime/include/attnres.h) on the CPU device. Included from
# tests/CMakeLists.txt.

# gen/: throwaway templates in a temp dir, plus the real templates/ read
# through an absolute path (independent of ATTNRES_TEMPLATE_DIR at run time).
attnres_unit_test(gen_unit test_gen.c TIMEOUT 120 LABEL gen TEMPLATES LIBS argen)

# The generated bf16 stores round to nearest even on each path they take
# (AVX512-BF16's instruction and the portable rounding), compiled with the
# host compiler as the CPU backend compiles variants.
attnres_unit_test(gen_bf16_rounding test_bf16_rounding.c TIMEOUT 120 LABEL gen TEMPLATES LIBS argen)
target_compile_definitions(test_bf16_rounding PRIVATE HOST_CC="${CMAKE_C_COMPILER}")

# runtime/: the public API; one case plans from a database tuned with the
# ci preset: a copy of the suite's (fixture ci_db), tuned again, which then
# measures nothing new. SQLite marks a copy's winners provisional, as a
# disturbed tune would, for the case that reads the plan's explanation.
attnres_unit_test(runtime_unit test_runtime.c TIMEOUT 900 LABEL runtime
  LIBS attnres_static Threads::Threads m SQLite::SQLite3)
set_tests_properties(runtime_unit PROPERTIES FIXTURES_REQUIRED ci_db)
target_compile_definitions(test_runtime PRIVATE ATTNRES_CLI="$<TARGET_FILE:attnres_cli>")
add_dependencies(test_runtime attnres_cli)
