# Every CUDA variant that `attnres gen --list` lists runs in the simulated
# driver (libattnres-cudasim.so, target attnres_cudasim) on at least two
# problems its applies() accepts and matches the fp64 reference at the
# DESIGN §1 tolerances, with no fault. The kernels are NVRTC's PTX, loaded
# and launched through the CUDA backend's own operations. Skips (exit 77)
# when NVRTC cannot be loaded. Included from tests/cudasim/CMakeLists.txt,
# after the attnres_cudasim target.
add_executable(test_cuda_variants ${CMAKE_CURRENT_LIST_DIR}/test_cuda_variants.c)
target_include_directories(test_cuda_variants PRIVATE
  ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_LIST_DIR}/../lib ${CMAKE_CURRENT_LIST_DIR}/../../runtime/src)
target_compile_definitions(test_cuda_variants PRIVATE ATTNRES_TEMPLATE_DIR="${ATTNRES_TEMPLATE_DIR}")
target_link_libraries(test_cuda_variants PRIVATE argen attnres_static Threads::Threads m ${CMAKE_DL_LIBS})
add_test(NAME cudasim_every_cuda_variant_matches_reference COMMAND test_cuda_variants)
set_tests_properties(cudasim_every_cuda_variant_matches_reference PROPERTIES
  TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS "cuda;cudasim"
  ENVIRONMENT "ATTNRES_CUDA_DRIVER=$<TARGET_FILE:attnres_cudasim>;ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR};ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache/cudasim-variants")

# Every variant of the CUDA mix backward (the test above runs a covering
# sample of them): the full tier (tests/CMakeLists.txt).
add_test(NAME cudasim_every_cuda_mix_backward_variant COMMAND test_cuda_variants --all-backward)
set_tests_properties(cudasim_every_cuda_mix_backward_variant PROPERTIES
  TIMEOUT 900 SKIP_RETURN_CODE 77 LABELS "cuda;cudasim"
  ENVIRONMENT "ATTNRES_CUDA_DRIVER=$<TARGET_FILE:attnres_cudasim>;ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR};ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache/cudasim-variants")
