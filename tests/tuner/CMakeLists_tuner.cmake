# Unit tests of the tuner library (tuner/): the problems-file parser, its
# decisions on given timings, the determinism check, the ceilings and the
# streaming pass. The tuner's end-to-end tests (tune runs killed, disturbed,
# sharded) are the scripts beside this file, registered in
# tests/CMakeLists.txt. Included from tests/CMakeLists.txt.

# The problems-file parser alone, and the example of docs/problems.md.
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-data/problems)
attnres_unit_test(tuner_problems_file test_problems.c TIMEOUT 60 LABEL tuner
  SOURCES ${CMAKE_SOURCE_DIR}/tuner/src/problems.c ${CMAKE_SOURCE_DIR}/tuner/src/parse_int.c INCLUDES ${CMAKE_SOURCE_DIR}/tuner/include
  LIBS attnres_impl Threads::Threads m
  ARGS ${CMAKE_SOURCE_DIR}/docs/problems.md ${CMAKE_BINARY_DIR}/test-data/problems)

# The tuner library's decisions on given timings (no kernel is run): timing
# statistics, the halving keep count, the finalists, resources and the
# choice among equivalent candidates with its tie-breaks.
attnres_unit_test(tuner_unit test_tuner.c TIMEOUT 60 LABEL tuner LIBS artuner)

# The determinism check of a backward candidate: a CPU mix_backward variant
# measured as a tuning run measures it (in process and in a child), as
# generated (ok) and with stale workspace bytes let into du
# (nondeterministic, the message naming the gradient that differed).
attnres_unit_test(tuner_determinism_check test_determinism_check.c TIMEOUT 120 LABEL tuner TEMPLATES LIBS artuner)

# The ceilings a timing is held to: the blend and the out-of-cache check on
# synthetic figures, and the CPU device's streaming kernels (docs/design.md §2).
attnres_unit_test(tuner_ceilings test_ceilings.c TIMEOUT 120 LABEL tuner LIBS artuner)
# The cache size from the read sweep, alone on the machine, where the sweep
# must find it (tests/tuner/test_ceilings.c).
add_test(NAME tuner_cache_from_read_sweep COMMAND test_ceilings --case test_cpu_device_measures_every_kernel)
set_tests_properties(tuner_cache_from_read_sweep PROPERTIES TIMEOUT 120 LABELS "unit;tuner" RUN_SERIAL TRUE
  ENVIRONMENT "ATTNRES_TEST_ALONE=1")

# The streaming pass a beyond-cache kernel is timed next to: its steps from
# the ceilings, what a pass copies and reads, refused steps, the fraction
# the interleaved rounds report, and the paired check (paired_stream.h).
attnres_unit_test(tuner_paired_stream test_paired_stream.c TIMEOUT 120 LABEL tuner TEMPLATES LIBS artuner)
