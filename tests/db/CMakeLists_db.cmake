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
get_target_property(ardb_robust_write_sources ardb_write SOURCES)
get_target_property(ardb_robust_tool_sources ardb SOURCES)
list(APPEND ardb_robust_sources ${ardb_robust_write_sources} ${ardb_robust_tool_sources})
list(TRANSFORM ardb_robust_sources PREPEND ${CMAKE_SOURCE_DIR}/db/)
add_executable(test_db_robust ${CMAKE_CURRENT_LIST_DIR}/test_db_robust.c ${ardb_robust_sources}
               ${CMAKE_SOURCE_DIR}/cli/svg_plot.c)
target_include_directories(test_db_robust PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${ATTNRES_TEST_LIB_DIR} ${CMAKE_SOURCE_DIR}/db/core
                           ${CMAKE_SOURCE_DIR}/db/write ${CMAKE_SOURCE_DIR}/db/tools ${CMAKE_SOURCE_DIR}/cli)
target_link_libraries(test_db_robust PRIVATE SQLite::SQLite3 m)
if(ATTNRES_HAVE_ASAN_UBSAN)
  target_compile_options(test_db_robust PRIVATE ${ardb_robust_sanitize})
  target_link_options(test_db_robust PRIVATE ${ardb_robust_sanitize})
endif()
add_test(NAME db_robust_unit COMMAND test_db_robust)
set_tests_properties(db_robust_unit PROPERTIES TIMEOUT 120 LABELS "unit;db"
  ENVIRONMENT "ASAN_OPTIONS=abort_on_error=0:detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

# Opening a database at an odd path: FIFOs and devices are refused without
# blocking (under an alarm), and a database in a read-only directory is
# read. The read-only cases skip (77), saying why, where the test can make
# no read-only directory (root without mount namespaces).
attnres_unit_test(db_open_refuses_fifos_and_devices test_db_open_paths.c TIMEOUT 60 LABEL db
  LIBS attnres_static ardb Threads::Threads m
  ARGS --case test_fifo_is_refused_without_blocking --case test_device_is_refused
       --case test_fifo_beside_the_file_is_refused)
add_test(NAME db_open_read_only_directory COMMAND test_db_open_paths
  --case test_read_only_directory_is_read --case test_unfolded_log_in_read_only_directory_is_refused)
set_tests_properties(db_open_read_only_directory PROPERTIES TIMEOUT 60 LABELS "unit;db" SKIP_RETURN_CODE 77)

# The command line on the same odd paths: `plan`, `db show` and `run` with a
# FIFO as --db (refused at once), and with a database in a read-only
# directory (read; skipped, saying why, where none can be made).
add_test(NAME cli_db_fifo_refused_at_once
  COMMAND ${CMAKE_COMMAND} -E env ${ATTNRES_TEST_ENV}
          ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/cli/test_db_odd_files.py
          --case "plan --db FIFO is refused at once" --case "db show --db FIFO is refused at once"
          --case "run --db FIFO is refused at once" $<TARGET_FILE:attnres_cli>)
add_test(NAME cli_db_read_only_directory
  COMMAND ${CMAKE_COMMAND} -E env ${ATTNRES_TEST_ENV}
          ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/cli/test_db_odd_files.py
          --case "plan reads a database in a read-only directory"
          --case "db show reads a database in a read-only directory"
          --case "run reads a database in a read-only directory" $<TARGET_FILE:attnres_cli>)
set_tests_properties(cli_db_fifo_refused_at_once cli_db_read_only_directory PROPERTIES TIMEOUT 200 LABELS cli)
set_tests_properties(cli_db_read_only_directory PROPERTIES SKIP_RETURN_CODE 77)

# The unit tests of db/tools/history.c, db/tools/exchange.c and
# db/write/migrate.c; fixtures/db_v1.sql is a file as version 1 wrote it
# (also read by tests/cli/test_regress.sh).
set(ATTNRES_DB_V1_FIXTURE ${CMAKE_CURRENT_LIST_DIR}/fixtures/db_v1.sql)
attnres_unit_test(db_history_unit test_db_history.c TIMEOUT 120 LABEL db LIBS ardb m
  ARGS ${ATTNRES_DB_V1_FIXTURE})
