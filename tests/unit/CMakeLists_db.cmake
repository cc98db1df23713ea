# Unit tests of the tuning database access layer (db/). Included from
# tests/CMakeLists.txt.
attnres_unit_test(db_unit test_db.c TIMEOUT 120 LABEL db LIBS ardb m)

# The database defects that sanitizers found: a use after free
# in import, undefined float-to-int conversions in the SVG charts, imports
# of impossible values. The test compiles its own copy of db/ and of the
# chart writer with AddressSanitizer and UndefinedBehaviorSanitizer where the
# compiler offers them, so that a memory or UB defect fails it in an
# ordinary build too, not only under a sanitizer configuration.
include(CheckCSourceCompiles)
set(ardb_robust_sanitize -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all
    -fno-omit-frame-pointer)
set(CMAKE_REQUIRED_FLAGS "${ardb_robust_sanitize}")
string(REPLACE ";" " " CMAKE_REQUIRED_FLAGS "${CMAKE_REQUIRED_FLAGS}")
set(CMAKE_REQUIRED_LINK_OPTIONS ${ardb_robust_sanitize})
check_c_source_compiles("int main(void) { return 0; }" ATTNRES_HAVE_ASAN_UBSAN)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
get_target_property(ardb_robust_sources ardb_core SOURCES)
get_target_property(ardb_robust_tool_sources ardb SOURCES)
list(APPEND ardb_robust_sources ${ardb_robust_tool_sources})
list(TRANSFORM ardb_robust_sources PREPEND ${CMAKE_SOURCE_DIR}/db/)
add_executable(test_db_robust ${CMAKE_CURRENT_LIST_DIR}/test_db_robust.c ${ardb_robust_sources}
               ${CMAKE_SOURCE_DIR}/cli/svg_plot.c)
target_include_directories(test_db_robust PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_SOURCE_DIR}/db/core
                           ${CMAKE_SOURCE_DIR}/db/tools ${CMAKE_SOURCE_DIR}/cli)
target_link_libraries(test_db_robust PRIVATE SQLite::SQLite3 m)
if(ATTNRES_HAVE_ASAN_UBSAN)
  target_compile_options(test_db_robust PRIVATE ${ardb_robust_sanitize})
  target_link_options(test_db_robust PRIVATE ${ardb_robust_sanitize})
endif()
add_test(NAME db_robust_unit COMMAND test_db_robust)
set_tests_properties(db_robust_unit PROPERTIES TIMEOUT 120 LABELS "unit;db"
  ENVIRONMENT "ASAN_OPTIONS=abort_on_error=0:detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
