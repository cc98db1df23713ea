# Unit tests of the tuning database access layer (db/). Included from
# tests/CMakeLists.txt.
add_executable(test_db ${CMAKE_CURRENT_LIST_DIR}/test_db.c)
target_include_directories(test_db PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(test_db PRIVATE ardb m)
add_test(NAME db_unit COMMAND test_db)
set_tests_properties(db_unit PROPERTIES TIMEOUT 120 LABELS "unit;db")
