# Unit tests of the runtime (runtime/): the public API on the CPU device,
# the references, the ops and their argument checks, the CPU kernels
# (generic, built-in, every template variant) and the miss file. Included
# from tests/CMakeLists.txt.

# runtime/: the public API; one case plans from a database tuned with the
# ci preset: a copy of the suite's (fixture ci_db), tuned again, which then
# measures nothing new. SQLite marks a copy's winners provisional, as a
# disturbed tune would, for the case that reads the plan's explanation.
attnres_unit_test(runtime_unit test_runtime.c TIMEOUT 900 LABEL runtime
  LIBS attnres_static Threads::Threads m SQLite::SQLite3)
set_tests_properties(runtime_unit PROPERTIES FIXTURES_REQUIRED ci_db)
target_compile_definitions(test_runtime PRIVATE ATTNRES_CLI="$<TARGET_FILE:attnres_cli>")
add_dependencies(test_runtime attnres_cli)

# Block AttnRes phase1/phase2 (two-phase form): the fp64 references and their
# identity with mix, the run API and its argument checks, the generic kernels
# and a spread of template variants compiled as the tuner compiles them.
attnres_unit_test(runtime_phase_ops test_phase_ops.c TIMEOUT 300 LABEL runtime TEMPLATES
  LIBS attnres_static argen Threads::Threads m)

# The fp64 backward references (DESIGN §1b) against central finite
# differences of the fp64 forward references, in every form, the phases
# chained against the mix, accumulation, determinism and refusals (well
# under a second).
attnres_unit_test(runtime_reference_backward test_reference_backward.c TIMEOUT 60 LABEL runtime
  LIBS attnres_static Threads::Threads m)

# The mix backward on the CPU (templates/cpu/mix_backward.lua): the built-in
# kernels of every ISA level the host has, and the scalar one, through plans
# against the fp64 reference backward in every form, bit-identical gradients
# across runs and at 1 and 2 threads, refusals, and a covering sample of the
# template's variants; with --all every variant.
attnres_unit_test(runtime_mix_backward test_mix_backward.c TIMEOUT 300 LABEL runtime TEMPLATES
  LIBS attnres_static argen Threads::Threads m)
add_test(NAME runtime_mix_backward_variants COMMAND test_mix_backward --all)
set_tests_properties(runtime_mix_backward_variants PROPERTIES TIMEOUT 900 LABELS "unit;runtime")

# Every variant of the fused CPU mix template (at two threads), compiled as
# the tuner compiles it, against the fp64 reference over shapes that reach
# every path of the template. Compiling is most of it: alone, 234 s for the
# 142 variants of an AVX-512 host (Zen 4 guest, 2 cores); beside other
# tests under ctest -j2 it takes longer.
attnres_unit_test(runtime_cpu_mix_variants test_cpu_mix_variants.c TIMEOUT 900 LABEL runtime TEMPLATES
  LIBS attnres_static argen Threads::Threads m)
# The same over a covering sample (tests/lib/test_covering.h): every value
# of every parameter at least once, six variants instead of 142.
add_test(NAME runtime_cpu_mix_variants_sample COMMAND test_cpu_mix_variants --sample)
set_tests_properties(runtime_cpu_mix_variants_sample PROPERTIES TIMEOUT 300 LABELS "unit;runtime")

# The CPU built-in kernels at every ISA level the host has (ATTNRES_CPU_BUILTIN_ISA).
attnres_unit_test(runtime_cpu_builtins test_cpu_builtins.c TIMEOUT 300 LABEL runtime
  LIBS attnres_static Threads::Threads m)

# The miss file the runtime writes for plans that fall back.
attnres_unit_test(runtime_miss_file test_miss_file.c TIMEOUT 120 LABEL runtime
  LIBS attnres_static Threads::Threads m)

# What the API refuses before a launch, each with EINVAL and a message
# naming the argument or the limit.
attnres_unit_test(runtime_api_checks test_api_checks.c TIMEOUT 120 LABEL runtime
  LIBS attnres_static Threads::Threads m)
# The same checks at random around every limit and overflow boundary,
# against the test's own model and the fp64 reference (a few seconds).
attnres_unit_test(runtime_plan_checks_property test_plan_checks_property.c TIMEOUT 120 LABEL runtime
  LIBS attnres_static Threads::Threads m)
