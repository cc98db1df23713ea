# attnres_unit_test(NAME SOURCE TIMEOUT LABEL [TEMPLATES] [LIBS ...]
#                   [SOURCES ...] [INCLUDES ...] [ARGS ...]): one C test
# program built from tests/unit/SOURCE (plus SOURCES, absolute paths) with
# tests/unit on its include path, linked with LIBS, run as ctest test NAME
# with ARGS, labelled "unit;LABEL". TEMPLATES defines TEMPLATE_DIR as the
# source tree's templates/, for tests that generate variants themselves.
# The program takes SOURCE's name without its extension.
set(ATTNRES_UNIT_DIR ${CMAKE_CURRENT_LIST_DIR})

function(attnres_unit_test name source)
  cmake_parse_arguments(PARSE_ARGV 2 T "TEMPLATES" "TIMEOUT;LABEL" "LIBS;SOURCES;INCLUDES;ARGS")
  get_filename_component(exe ${source} NAME_WE)
  add_executable(${exe} ${ATTNRES_UNIT_DIR}/${source} ${T_SOURCES})
  target_include_directories(${exe} PRIVATE ${ATTNRES_UNIT_DIR} ${T_INCLUDES})
  if(T_TEMPLATES)
    target_compile_definitions(${exe} PRIVATE TEMPLATE_DIR="${CMAKE_SOURCE_DIR}/templates")
  endif()
  target_link_libraries(${exe} PRIVATE ${T_LIBS})
  add_test(NAME ${name} COMMAND ${exe} ${T_ARGS})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;${T_LABEL}")
endfunction()
