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
