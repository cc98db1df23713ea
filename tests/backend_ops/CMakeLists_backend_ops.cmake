# backend_ops: the op x backend harness (docs/testing.md, "The op x backend
# harness"): every kernel of every backend against the fp64 reference, one
# case at a time or all of them, with filters. Its CUDA part is built where
# the CUDA backend is, and runs on the simulated driver under ctest.
# Included from tests/CMakeLists.txt.
set(backend_ops_sources ${CMAKE_CURRENT_LIST_DIR}/backend_ops.c ${CMAKE_CURRENT_LIST_DIR}/ops_cpu.c
  ${CMAKE_CURRENT_LIST_DIR}/ops_cpu_backward.c ${CMAKE_CURRENT_LIST_DIR}/ops_cpu_phase_backward.c)
if(ATTNRES_CUDA)
  list(APPEND backend_ops_sources ${CMAKE_CURRENT_LIST_DIR}/ops_cuda.c
    ${CMAKE_CURRENT_LIST_DIR}/ops_cuda_phase_backward.c)
endif()
add_executable(backend_ops ${backend_ops_sources})
target_include_directories(backend_ops PRIVATE
  ${CMAKE_CURRENT_LIST_DIR} ${ATTNRES_TEST_LIB_DIR} ${CMAKE_CURRENT_LIST_DIR}/../cudasim)
target_compile_definitions(backend_ops PRIVATE TEMPLATE_DIR="${ATTNRES_TEMPLATE_DIR}"
  ATTNRES_TEMPLATE_DIR="${ATTNRES_TEMPLATE_DIR}" $<$<BOOL:${ATTNRES_CUDA}>:BACKEND_OPS_CUDA>)
target_link_libraries(backend_ops PRIVATE argen attnres_static Threads::Threads m ${CMAKE_DL_LIBS})

# The CPU's built-in kernels at every ISA level the host has
# (ATTNRES_CPU_BUILTIN_ISA): every forward op, dtype, form and epilogue.
add_test(NAME runtime_cpu_builtins COMMAND backend_ops --backend cpu --op "mix|phase?" --variant "builtin-*")
# The mix backward on the CPU (templates/cpu/mix_backward.lua): the built-in
# kernel of the host's level and of every ISA level through plans, the
# gradients bit-identical across runs, parts and thread counts, and a
# covering sample of the template's variants. The API's refusals are
# runtime_mix_backward_api's.
add_test(NAME runtime_mix_backward COMMAND backend_ops --backend cpu --op mix_backward --sample)
# The same with every variant of the template: the full tier.
add_test(NAME runtime_mix_backward_variants COMMAND backend_ops --backend cpu --op mix_backward --all)
# The backwards of Block AttnRes' two phases on the CPU
# (templates/cpu/phase1_backward.lua, phase2_backward.lua), as the mix
# backward's: the host's built-in kernels and those of every ISA level
# through plans, every gradient against the fp64 reference, bit-identical
# across runs, parts and thread counts, and a covering sample of each
# template's variants. The API's refusals are runtime_phase_backward_api's.
add_test(NAME runtime_phase_backward COMMAND backend_ops --backend cpu --op "phase?_backward" --sample)
# The same with every variant of both templates: the full tier.
add_test(NAME runtime_phase_backward_variants COMMAND backend_ops --backend cpu --op "phase?_backward" --all)
# A spread of the variants of cpu/phase1 and cpu/phase2, compiled as the
# tuner compiles them.
add_test(NAME runtime_phase_ops COMMAND backend_ops --backend cpu --op "phase?" --variant "phase*")
# The variants of the fused CPU mix (at two threads) over shapes that reach
# every path of the template: a covering sample (tests/lib/test_covering.h),
# every value of every parameter at least once, six variants instead of 156.
add_test(NAME runtime_cpu_mix_variants_sample COMMAND backend_ops --backend cpu --op mix --variant "mix_c_*" --sample)
# The same over every variant. Compiling is most of it: alone, 234 s for
# the 142 variants of an AVX-512 host (Zen 4 guest, 2 cores); beside other
# tests under ctest -j2 it takes longer. The full tier (tests/CMakeLists.txt).
add_test(NAME runtime_cpu_mix_variants COMMAND backend_ops --backend cpu --op mix --variant "mix_c_*" --all)
set_tests_properties(runtime_cpu_builtins runtime_phase_ops runtime_cpu_mix_variants_sample runtime_mix_backward
  runtime_phase_backward PROPERTIES TIMEOUT 300 LABELS "unit;runtime")
set_tests_properties(runtime_cpu_mix_variants runtime_mix_backward_variants runtime_phase_backward_variants
  PROPERTIES TIMEOUT 900 LABELS "unit;runtime")

if(ATTNRES_CUDA)
  # Every CUDA variant that `attnres gen --list` lists (of the backwards,
  # cuda/mix_backward, phase1_backward and phase2_backward, a covering sample
  # each) runs in the simulated driver (libattnres-cudasim.so, target
  # attnres_cudasim) on at least two problems its applies() accepts and
  # matches the fp64 reference at the DESIGN §1 tolerances, with no fault.
  # The kernels are NVRTC's PTX, loaded and launched through the CUDA
  # backend's own operations. Skips (exit 77) when NVRTC cannot be loaded.
  add_test(NAME cudasim_every_cuda_variant_matches_reference COMMAND backend_ops --backend cuda --sample)
  # Every variant of the CUDA mix backward: the full tier.
  add_test(NAME cudasim_every_cuda_mix_backward_variant COMMAND backend_ops --backend cuda --op mix_backward --all)
  # Every variant of the CUDA phase backwards (cuda/phase1_backward.lua,
  # phase2_backward.lua), their cases in ops_cuda_phase_backward.c: the full
  # tier.
  add_test(NAME cudasim_every_cuda_phase_backward_variant
    COMMAND backend_ops --backend cuda --op "phase?_backward" --all)
  set_tests_properties(cudasim_every_cuda_variant_matches_reference PROPERTIES TIMEOUT 600)
  set_tests_properties(cudasim_every_cuda_mix_backward_variant cudasim_every_cuda_phase_backward_variant
    PROPERTIES TIMEOUT 900)
  set_tests_properties(cudasim_every_cuda_variant_matches_reference cudasim_every_cuda_mix_backward_variant
    cudasim_every_cuda_phase_backward_variant
    PROPERTIES SKIP_RETURN_CODE 77 LABELS "cuda;cudasim"
    ENVIRONMENT "ATTNRES_CUDA_DRIVER=$<TARGET_FILE:attnres_cudasim>;ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR};ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache/cudasim-variants")
endif()
