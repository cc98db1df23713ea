# What the command line takes from users: `attnres run` writes its outputs all
# or none, integer flags and fields are range-checked, the .npy reader reads
# the header as the Python literal it is, and the option parser. Included from
# tests/CMakeLists.txt.
attnres_cli_py_test(cli_run_outputs_all_or_none test_run_outputs_atomic.py 120)

attnres_cli_py_test(cli_integer_ranges test_cli_ranges.py 300)

# The .npy reader alone, on files each case writes into a scratch directory.
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-data/npy)
attnres_unit_test(tuner_npy_reader test_npy.c TIMEOUT 60 LABEL tuner
  SOURCES ${CMAKE_SOURCE_DIR}/cli/npy.c ${CMAKE_SOURCE_DIR}/cli/atomic_file.c INCLUDES ${CMAKE_SOURCE_DIR}/cli ARGS ${CMAKE_BINARY_DIR}/test-data/npy)

# The command line's option parser alone (cli/cli.c): every kind of value,
# positional arguments, "--", and refusals that name the flag and the value.
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-data/cli-options)
attnres_unit_test(cli_options_unit test_cli_options.c TIMEOUT 60 LABEL cli SOURCES ${CMAKE_SOURCE_DIR}/cli/cli.c ${CMAKE_SOURCE_DIR}/cli/cli_util.c
  INCLUDES ${CMAKE_SOURCE_DIR}/cli LIBS artuner ARGS ${CMAKE_BINARY_DIR}/test-data/cli-options)

# docs/templates.md's minimal template, taken out of the page: listed,
# emitted, compiled and tuned (about 10 s, most of it the ceilings).
add_test(NAME gen_templates_doc_example
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_templates_doc.sh $<TARGET_FILE:attnres_cli>
          ${CMAKE_SOURCE_DIR}/docs/templates.md ${ATTNRES_TEMPLATE_DIR})
set_tests_properties(gen_templates_doc_example PROPERTIES TIMEOUT 300 LABELS "gen;cli")
