# tests/oom: out-of-memory injection for the runtime's public API (see
# oom_runtime.c). The allocation hook is -Wl,--wrap on this test binary
# only: the runtime's static library is linked in unchanged and its calls to
# the allocator are rerouted to the test's counting, failing wrappers.
# Included from tests/CMakeLists.txt.
add_executable(test_oom_runtime ${CMAKE_CURRENT_LIST_DIR}/oom_runtime.c)
target_link_libraries(test_oom_runtime PRIVATE attnres_static SQLite::SQLite3 Threads::Threads m)
target_link_options(test_oom_runtime PRIVATE
  "LINKER:--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free"
  "LINKER:--wrap=strdup,--wrap=strndup,--wrap=posix_memalign")
add_test(NAME oom_runtime_every_allocation_fails_cleanly
  COMMAND test_oom_runtime ${CMAKE_BINARY_DIR}/test-data/ci.db)
set_tests_properties(oom_runtime_every_allocation_fails_cleanly PROPERTIES
  FIXTURES_REQUIRED ci_db TIMEOUT 900 LABELS "oom;runtime"
  ENVIRONMENT "ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR}")
