# attnres_unit_test(NAME SOURCE TIMEOUT LABEL [TEMPLATES] [LIBS ...]
#                   [SOURCES ...] [INCLUDES ...] [ARGS ...]): one C test
# program built from SOURCE in the folder of the list file that calls it
# (plus SOURCES, absolute paths) with that folder and tests/lib (the shared
# C test helpers) on its include path, linked with LIBS, run as ctest test NAME
# with ARGS, labelled "unit;LABEL". TEMPLATES defines TEMPLATE_DIR as the
# source tree's templates/, for tests that generate variants themselves.
# The program takes SOURCE's name without its extension.
set(ATTNRES_TEST_LIB_DIR ${CMAKE_CURRENT_LIST_DIR})

function(attnres_unit_test name source)
  cmake_parse_arguments(PARSE_ARGV 2 T "TEMPLATES" "TIMEOUT;LABEL" "LIBS;SOURCES;INCLUDES;ARGS")
  get_filename_component(exe ${source} NAME_WE)
  # In a function, CMAKE_CURRENT_LIST_DIR is the caller's folder.
  add_executable(${exe} ${CMAKE_CURRENT_LIST_DIR}/${source} ${T_SOURCES})
  target_include_directories(${exe} PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${ATTNRES_TEST_LIB_DIR} ${T_INCLUDES})
  if(T_TEMPLATES)
    target_compile_definitions(${exe} PRIVATE TEMPLATE_DIR="${CMAKE_SOURCE_DIR}/templates")
  endif()
  target_link_libraries(${exe} PRIVATE ${T_LIBS})
  add_test(NAME ${name} COMMAND ${exe} ${T_ARGS})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;${T_LABEL}")
endfunction()

# attnres_cli_py_test(NAME SCRIPT TIMEOUT [ARGS ...]): the Python test
# tests/cli/SCRIPT run on the command line's binary (then ARGS), in the
# suite's environment (ATTNRES_TEST_ENV), as ctest test NAME labelled cli.
function(attnres_cli_py_test name script timeout)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} -E env ${ATTNRES_TEST_ENV}
            ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/cli/${script} $<TARGET_FILE:attnres_cli> ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout} LABELS cli)
endfunction()
