# What the command line takes from users: `attnres run` writes its outputs all
# or none, integer flags and fields are range-checked, the .npy reader reads
# the header as the Python literal it is, and docs/problems.md's example is a
# problems file the parser reads. Included from tests/CMakeLists.txt.
add_test(NAME cli_run_outputs_all_or_none
  COMMAND ${CMAKE_COMMAND} -E env ${ATTNRES_TEST_ENV}
          ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_run_outputs_atomic.py $<TARGET_FILE:attnres_cli>)
set_tests_properties(cli_run_outputs_all_or_none PROPERTIES TIMEOUT 120 LABELS cli)

add_test(NAME cli_integer_ranges
  COMMAND ${CMAKE_COMMAND} -E env ${ATTNRES_TEST_ENV}
          ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_cli_ranges.py $<TARGET_FILE:attnres_cli>)
set_tests_properties(cli_integer_ranges PROPERTIES TIMEOUT 300 LABELS cli)

# The .npy reader alone, on files each case writes into a scratch directory.
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-data/npy)
attnres_unit_test(tuner_npy_reader test_npy.c TIMEOUT 60 LABEL tuner
  SOURCES ${CMAKE_SOURCE_DIR}/cli/npy.c ${CMAKE_SOURCE_DIR}/cli/atomic_file.c INCLUDES ${CMAKE_SOURCE_DIR}/cli ARGS ${CMAKE_BINARY_DIR}/test-data/npy)

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

# The command line's option parser alone (cli/cli.c): every kind of value,
# positional arguments, "--", and refusals that name the flag and the value.
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-data/cli-options)
attnres_unit_test(cli_options_unit test_cli_options.c TIMEOUT 60 LABEL cli SOURCES ${CMAKE_SOURCE_DIR}/cli/cli.c
  INCLUDES ${CMAKE_SOURCE_DIR}/cli LIBS artuner ARGS ${CMAKE_BINARY_DIR}/test-data/cli-options)

# The ceilings a timing is held to: the blend and the out-of-cache check on
# synthetic figures, and the CPU device's streaming kernels (docs/design.md §2).
attnres_unit_test(tuner_ceilings test_ceilings.c TIMEOUT 120 LABEL tuner LIBS artuner)
# The cache size from the read sweep, alone on the machine, where the sweep
# must find it (tests/unit/test_ceilings.c).
add_test(NAME tuner_cache_from_read_sweep COMMAND test_ceilings --case test_cpu_device_measures_every_kernel)
set_tests_properties(tuner_cache_from_read_sweep PROPERTIES TIMEOUT 120 LABELS "unit;tuner" RUN_SERIAL TRUE
  ENVIRONMENT "ATTNRES_TEST_ALONE=1")

# The streaming pass a beyond-cache kernel is timed next to: its steps from
# the ceilings, what a pass copies and reads, refused steps, the fraction
# the interleaved rounds report, and the paired check (paired_stream.h).
attnres_unit_test(tuner_paired_stream test_paired_stream.c TIMEOUT 120 LABEL tuner TEMPLATES LIBS artuner)

# docs/templates.md's minimal template, taken out of the page: listed,
# emitted, compiled and tuned (about 10 s, most of it the ceilings).
add_test(NAME gen_templates_doc_example
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_templates_doc.sh $<TARGET_FILE:attnres_cli>
          ${CMAKE_SOURCE_DIR}/docs/templates.md ${ATTNRES_TEMPLATE_DIR})
set_tests_properties(gen_templates_doc_example PROPERTIES TIMEOUT 300 LABELS "gen;cli")
