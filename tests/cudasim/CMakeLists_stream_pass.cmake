# The CUDA backend's stream pass (the paired ceiling of the tuner's final
# rounds) on the simulated driver: the grid-stride read and copy kernels and
# the driver's copy move the bytes their steps name, bad steps are refused
# by name, and the tuner's pass for an out-of-cache kernel runs. Skips (exit
# 77) when NVRTC cannot be loaded. Included from tests/cudasim/CMakeLists.txt.
add_executable(test_cuda_stream_pass ${CMAKE_CURRENT_LIST_DIR}/test_cuda_stream_pass.c)
target_include_directories(test_cuda_stream_pass PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/../lib ${CMAKE_CURRENT_LIST_DIR}/../../runtime/src)
target_link_libraries(test_cuda_stream_pass PRIVATE artuner attnres_static Threads::Threads m ${CMAKE_DL_LIBS})
add_test(NAME cudasim_stream_pass_moves_its_bytes COMMAND test_cuda_stream_pass)
set_tests_properties(cudasim_stream_pass_moves_its_bytes PROPERTIES
  TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS "cuda;cudasim"
  ENVIRONMENT "ATTNRES_CUDA_DRIVER=$<TARGET_FILE:attnres_cudasim>;ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache/cudasim-stream-pass")
