# runtime/cuda.cmake - the CUDA backend, included by runtime/CMakeLists.txt.
#
# Defines ATTNRES_CUDA_SOURCES: the backend (Driver API and NVRTC, both
# loaded with dlopen, so nothing CUDA is needed to build or link) plus the
# built-in generic kernels' CUDA sources, generated here from
# templates/cuda/mix_twopass.lua (the mix's generic kernel is a two-pass
# one), phase1.lua and phase2.lua and embedded as C strings; the runtime
# compiles them with NVRTC for the device it opens.
set(ATTNRES_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_args.c
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_args_phase1_backward.c
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_args_phase2_backward.c
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_backend.c
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_driver.c
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_timing.c
  ${CMAKE_CURRENT_LIST_DIR}/src/nvrtc.c)

foreach(dtype f32 bf16 f16)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/cuda_generic_mix_${dtype}.c)
  attnres_generate(${out} MODE generic-source TEMPLATE cuda/mix_twopass ARGS ${dtype}
                   AFTER ar_cuda_generic_mix_${dtype}
                   COMMENT "Embedding the built-in CUDA mix kernel source (${dtype})")
  list(APPEND ATTNRES_CUDA_SOURCES ${out})
endforeach()

# The Block AttnRes phase kernels (templates/cuda/phase1.lua, phase2.lua)
# and the backwards (templates/cuda/mix_backward.lua, phase1_backward.lua,
# phase2_backward.lua).
foreach(op phase1 phase2 mix_backward phase1_backward phase2_backward)
  foreach(dtype f32 bf16 f16)
    set(out ${CMAKE_CURRENT_BINARY_DIR}/cuda_generic_${op}_${dtype}.c)
    attnres_generate(${out} MODE generic-source TEMPLATE cuda/${op} ARGS ${dtype}
                     AFTER ar_cuda_generic_${op}_${dtype}
                     COMMENT "Embedding the built-in CUDA ${op} kernel source (${dtype})")
    list(APPEND ATTNRES_CUDA_SOURCES ${out})
  endforeach()
endforeach()
