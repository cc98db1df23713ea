# Unit tests of the kernel generator (gen/) and of the public runtime API
# (runtime/include/attnres.h) on the CPU device. Included from
# tests/CMakeLists.txt.

# gen/: throwaway templates in a temp dir, plus the real templates/ read
# through an absolute path (independent of ATTNRES_TEMPLATE_DIR at run time).
add_executable(test_gen ${CMAKE_CURRENT_LIST_DIR}/test_gen.c)
target_include_directories(test_gen PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_compile_definitions(test_gen PRIVATE TEMPLATE_DIR="${CMAKE_SOURCE_DIR}/templates")
target_link_libraries(test_gen PRIVATE argen)
add_test(NAME gen_unit COMMAND test_gen)
set_tests_properties(gen_unit PROPERTIES TIMEOUT 120 LABELS "unit;gen")

# runtime/: the public API; one case tunes the ci preset with the CLI.
add_executable(test_runtime ${CMAKE_CURRENT_LIST_DIR}/test_runtime.c)
target_include_directories(test_runtime PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_compile_definitions(test_runtime PRIVATE ATTNRES_CLI="$<TARGET_FILE:attnres_cli>")
target_link_libraries(test_runtime PRIVATE attnres_static Threads::Threads m)
add_dependencies(test_runtime attnres_cli)
add_test(NAME runtime_unit COMMAND test_runtime)
set_tests_properties(runtime_unit PROPERTIES TIMEOUT 400 LABELS "unit;runtime")
