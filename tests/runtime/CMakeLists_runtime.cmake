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

# Block AttnRes phase1/phase2 (two-phase form) but for its kernels against
# the reference (tests/backend_ops runs those): the fp64 references' identity
# with mix, the run API and its argument checks, the time slot, the per-op
# kernel ABI and the thread count a kernel loads with.
attnres_unit_test(runtime_phase_api test_phase_api.c TIMEOUT 120 LABEL runtime TEMPLATES
  LIBS attnres_static argen Threads::Threads m)

# The fp64 backward references (DESIGN §1b) against central finite
# differences of the fp64 forward references, in every form, the phases
# chained against the mix, accumulation, determinism and refusals (well
# under a second).
attnres_unit_test(runtime_reference_backward test_reference_backward.c TIMEOUT 60 LABEL runtime
  LIBS attnres_static Threads::Threads m)

# The mix backward's API on the CPU apart from its kernels' gradients
# (backend_ops runs those: runtime_mix_backward): the refusals of bad
# arguments, workspaces and plans, the workspace size, T = 0.
attnres_unit_test(runtime_mix_backward_api test_mix_backward_api.c TIMEOUT 60 LABEL runtime
  LIBS attnres_static Threads::Threads m)

# The phase backwards' API (attnres_run_phase1_backward, _phase2_backward)
# on the CPU apart from their kernels' gradients (backend_ops runs those:
# runtime_phase_backward): every refusal with its message and nothing
# written, T = 0, another op's entry, attnres_plan_workspace_size for every
# op; and on the simulated driver, where the build has the CUDA backend, a
# CUDA plan of each op, its workspace size and its T = 0 run (about a
# second).
attnres_unit_test(runtime_phase_backward_api test_phase_backward_api.c TIMEOUT 60 LABEL runtime
  LIBS attnres_static Threads::Threads m)
if(ATTNRES_CUDA)
  add_dependencies(test_phase_backward_api attnres_cudasim)
  set_tests_properties(runtime_phase_backward_api PROPERTIES
    ENVIRONMENT "ATTNRES_CUDA_DRIVER=$<TARGET_FILE:attnres_cudasim>")
endif()

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
