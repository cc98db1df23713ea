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
add_executable(test_npy ${CMAKE_CURRENT_LIST_DIR}/../unit/test_npy.c ${CMAKE_SOURCE_DIR}/cli/npy.c)
target_include_directories(test_npy PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../unit ${CMAKE_SOURCE_DIR}/cli)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-data/npy)
add_test(NAME tuner_npy_reader COMMAND test_npy ${CMAKE_BINARY_DIR}/test-data/npy)
set_tests_properties(tuner_npy_reader PROPERTIES TIMEOUT 60 LABELS "unit;tuner")

# The problems-file parser alone, and the example of docs/problems.md.
add_executable(test_problems ${CMAKE_CURRENT_LIST_DIR}/../unit/test_problems.c
  ${CMAKE_SOURCE_DIR}/tuner/src/problems.c)
target_include_directories(test_problems PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../unit ${CMAKE_SOURCE_DIR}/tuner/include)
target_link_libraries(test_problems PRIVATE attnres_impl Threads::Threads m)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-data/problems)
add_test(NAME tuner_problems_file COMMAND test_problems ${CMAKE_SOURCE_DIR}/docs/problems.md
  ${CMAKE_BINARY_DIR}/test-data/problems)
set_tests_properties(tuner_problems_file PROPERTIES TIMEOUT 60 LABELS "unit;tuner")

# The tuner library's decisions on given timings (no kernel is run): timing
# statistics, the halving keep count, the finalists, resources and the
# choice among equivalent candidates with its tie-breaks.
add_executable(test_tuner ${CMAKE_CURRENT_LIST_DIR}/../unit/test_tuner.c)
target_include_directories(test_tuner PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../unit)
target_link_libraries(test_tuner PRIVATE artuner)
add_test(NAME tuner_unit COMMAND test_tuner)
set_tests_properties(tuner_unit PROPERTIES TIMEOUT 60 LABELS "unit;tuner")

# The command line's option parser alone (cli/cli.c): every kind of value,
# positional arguments, "--", and refusals that name the flag and the value.
add_executable(test_cli_options ${CMAKE_CURRENT_LIST_DIR}/../unit/test_cli_options.c
  ${CMAKE_SOURCE_DIR}/cli/cli.c)
target_include_directories(test_cli_options PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../unit ${CMAKE_SOURCE_DIR}/cli)
target_link_libraries(test_cli_options PRIVATE artuner)
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-data/cli-options)
add_test(NAME cli_options_unit COMMAND test_cli_options ${CMAKE_BINARY_DIR}/test-data/cli-options)
set_tests_properties(cli_options_unit PROPERTIES TIMEOUT 60 LABELS "unit;cli")

# The ceilings a timing is held to: the blend and the out-of-cache check on
# synthetic figures, and the CPU device's streaming kernels (docs/design.md §2).
add_executable(test_ceilings ${CMAKE_CURRENT_LIST_DIR}/../unit/test_ceilings.c)
target_include_directories(test_ceilings PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../unit)
target_link_libraries(test_ceilings PRIVATE artuner)
add_test(NAME tuner_ceilings COMMAND test_ceilings)
set_tests_properties(tuner_ceilings PROPERTIES TIMEOUT 120 LABELS "unit;tuner")
