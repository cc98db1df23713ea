# tests/configs: other configurations of this source tree build. Each test
# configures a fresh tree of its own (as tests/install does for the package)
# and builds only what the configuration is about, to stay cheap.
add_test(NAME build_without_cuda
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_build_no_cuda.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(build_without_cuda PROPERTIES TIMEOUT 900 LABELS build)
