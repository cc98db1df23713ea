# tests/cudasim/CMakeLists_selftest.cmake: the simulator's own tests, its
# opcodes and its fault checks. Included by tests/cudasim/CMakeLists.txt.
foreach(t ops faults)
  add_executable(test_cudasim_${t} ${CMAKE_CURRENT_LIST_DIR}/test_cudasim_${t}.c)
  target_include_directories(test_cudasim_${t} PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(test_cudasim_${t} PRIVATE attnres_cudasim m)
endforeach()
add_test(NAME cudasim_ops_known_results COMMAND test_cudasim_ops)
add_test(NAME cudasim_faults_are_caught COMMAND test_cudasim_faults)
set_tests_properties(cudasim_ops_known_results cudasim_faults_are_caught PROPERTIES
  TIMEOUT 120 LABELS "unit;cudasim")
