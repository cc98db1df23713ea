# NVRTC compiles every variant of templates/cuda/mix_online.lua,
# mix_twopass.lua, phase1.lua, phase2.lua and the backwards (mix_backward,
# phase1_backward, phase2_backward) for sm_90, and their generic and
# default variants for sm_80 too, with no warning, and no entry of a
# generic or default variant spills on either. Needs no
# GPU; skips (exit 77) when NVRTC cannot be loaded. Included from
# tests/CMakeLists.txt.
add_executable(test_nvrtc ${CMAKE_CURRENT_LIST_DIR}/test_nvrtc.c)
target_include_directories(test_nvrtc PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${ATTNRES_TEST_LIB_DIR} ${CMAKE_SOURCE_DIR}/runtime/src)
target_compile_definitions(test_nvrtc PRIVATE ATTNRES_TEMPLATE_DIR="${ATTNRES_TEMPLATE_DIR}")
target_link_libraries(test_nvrtc PRIVATE argen attnres_static Threads::Threads)
add_test(NAME nvrtc_compile_all_variants COMMAND test_nvrtc)
set_tests_properties(nvrtc_compile_all_variants PROPERTIES
  TIMEOUT 900 SKIP_RETURN_CODE 77 LABELS "unit;cuda"
  ENVIRONMENT "ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR}")
