# tests/fault: damaged databases never crash the host process
# (test_damaged_db.py; plan_probe plans through the public API only).
add_executable(plan_probe ${CMAKE_CURRENT_LIST_DIR}/plan_probe.c)
target_link_libraries(plan_probe PRIVATE attnres::attnres m)

add_test(NAME fault_damaged_databases_never_crash
  COMMAND ${CMAKE_COMMAND} -E env ${ATTNRES_TEST_ENV}
          ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_damaged_db.py
          $<TARGET_FILE:attnres_cli> $<TARGET_FILE:plan_probe> ${CMAKE_BINARY_DIR}/test-data/fault)
set_tests_properties(fault_damaged_databases_never_crash PROPERTIES TIMEOUT 1200 LABELS "fault;runtime")
