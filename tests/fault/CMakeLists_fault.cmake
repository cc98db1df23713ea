# tests/fault: damaged databases never crash the host process
# (test_damaged_db.py; plan_probe plans through the public API only).
add_executable(plan_probe ${CMAKE_CURRENT_LIST_DIR}/plan_probe.c)
target_include_directories(plan_probe PRIVATE ${ATTNRES_TEST_LIB_DIR})
target_link_libraries(plan_probe PRIVATE attnres::attnres m)

add_test(NAME fault_damaged_databases_never_crash
  COMMAND ${CMAKE_COMMAND} -E env ${ATTNRES_TEST_ENV}
          ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_damaged_db.py
          $<TARGET_FILE:attnres_cli> $<TARGET_FILE:plan_probe> ${CMAKE_BINARY_DIR}/test-data/fault)
set_tests_properties(fault_damaged_databases_never_crash PROPERTIES TIMEOUT 1200 LABELS "fault;runtime")

# I/O errors: the preloaded library that fails chosen file operations
# (iofault.c) and the test that drives it over every file the project
# writes, with a full disk beside it (test_io_errors.py).
add_library(iofault SHARED ${CMAKE_CURRENT_LIST_DIR}/iofault.c)
target_link_libraries(iofault PRIVATE ${CMAKE_DL_LIBS})
set_target_properties(iofault PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
add_test(NAME fault_io_errors_every_write_point
  COMMAND ${CMAKE_COMMAND} -E env ${ATTNRES_TEST_ENV}
          ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_io_errors.py
          $<TARGET_FILE:attnres_cli> $<TARGET_FILE:iofault>)
set_tests_properties(fault_io_errors_every_write_point PROPERTIES TIMEOUT 600 LABELS fault
  SKIP_RETURN_CODE 77)
