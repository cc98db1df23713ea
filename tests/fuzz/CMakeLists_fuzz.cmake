# tests/fuzz: one fuzz target for every loader a user can hand a file to.
# Each target (fuzz_TARGET.c, an LLVMFuzzerTestOneInput) is
# always built into fuzz_replay_TARGET, which replays the committed corpus
# corpus/TARGET/ under ctest on every build (see replay.c for what the file
# names expect); with -DATTNRES_FUZZ=ON (clang) it is also built into
# fuzz_TARGET, a libFuzzer binary (see tests/fuzz/README.md for how to run
# one). Included from tests/CMakeLists.txt.
set(ATTNRES_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})

# fuzz_add(TARGET SOURCES... LIBS...): SOURCES are the project files the
# target compiles in itself: the command line's loaders (cli/npy.c,
# cli/svg_plot.c), which no library holds, and the problems-file parser,
# taken alone rather than with the whole tuner library.
# INCLUDES are further include directories of the target's sources.
# RUNTIME marks a target that links the runtime, whose generated kernels
# use _Float16: clang before 15 does not have it on x86-64, so with such a
# clang only the replayer of that target is built (by the normal compiler
# tree) and the libFuzzer binary is left out with a notice.
function(fuzz_add name)
  cmake_parse_arguments(F "RUNTIME" "" "SOURCES;LIBS;INCLUDES" ${ARGN})
  set(srcs ${ATTNRES_FUZZ_DIR}/fuzz_${name}.c ${ATTNRES_FUZZ_DIR}/fuzz_util.c ${F_SOURCES})
  add_executable(fuzz_replay_${name} ${ATTNRES_FUZZ_DIR}/replay.c ${srcs})
  set(targets fuzz_replay_${name})
  set(libfuzzer ${ATTNRES_FUZZ})
  if(ATTNRES_FUZZ AND F_RUNTIME AND CMAKE_C_COMPILER_VERSION VERSION_LESS 15)
    message(STATUS "fuzz_${name}: not built (clang ${CMAKE_C_COMPILER_VERSION} lacks _Float16, which the runtime needs)")
    set(libfuzzer OFF)
  endif()
  if(libfuzzer)
    add_executable(fuzz_${name} ${srcs})
    target_compile_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
    target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
    list(APPEND targets fuzz_${name})
  endif()
  foreach(t ${targets})
    target_include_directories(${t} PRIVATE ${ATTNRES_FUZZ_DIR} ${PROJECT_SOURCE_DIR}/cli
                               ${PROJECT_SOURCE_DIR}/tuner/include ${PROJECT_SOURCE_DIR}/db/core ${PROJECT_SOURCE_DIR}/db/tools
                               ${PROJECT_SOURCE_DIR}/tests/lib
                               ${F_INCLUDES})
    target_link_libraries(${t} PRIVATE ${F_LIBS} m)
  endforeach()
  add_test(NAME fuzz_corpus_${name} COMMAND fuzz_replay_${name} ${ATTNRES_FUZZ_DIR}/corpus/${name})
  set_tests_properties(fuzz_corpus_${name} PROPERTIES TIMEOUT 300 LABELS "fuzz"
    ENVIRONMENT "ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache/fuzz;ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR}")
endfunction()

fuzz_add(npy SOURCES ${PROJECT_SOURCE_DIR}/cli/npy.c ${PROJECT_SOURCE_DIR}/cli/atomic_file.c)
fuzz_add(problems RUNTIME SOURCES ${PROJECT_SOURCE_DIR}/tuner/src/problems.c ${PROJECT_SOURCE_DIR}/tuner/src/parse_int.c
         LIBS attnres_impl)
fuzz_add(db_import LIBS ardb)
fuzz_add(misses RUNTIME LIBS attnres_impl Threads::Threads)
fuzz_add(damaged_db RUNTIME SOURCES ${PROJECT_SOURCE_DIR}/cli/svg_plot.c LIBS attnres_static ardb Threads::Threads)
# The Python extension's checks of borrowed DLPack tensors, which need no
# Python: the target builds the managed tensors a lying producer could.
fuzz_add(dlpack SOURCES ${PROJECT_SOURCE_DIR}/python/attnres/dlpack_check.c
         INCLUDES ${PROJECT_SOURCE_DIR}/python/attnres)
