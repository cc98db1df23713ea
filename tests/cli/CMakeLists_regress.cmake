# History, comparison and exchange of tuning databases from the command
# line: the end-to-end test of `attnres db regress` on a real slowdown and
# its refusals (the unit tests of db/tools are tests/db's). Included from
# tests/CMakeLists.txt.

# Its five tuning runs are real, but its verdicts are decided on synthetic
# timings (see test_regress.sh), so it needs no idle machine and runs
# alongside other tests.
add_test(NAME cli_regress_finds_real_slowdown
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_regress.sh $<TARGET_FILE:attnres_cli>
          ${ATTNRES_DB_V1_FIXTURE})
set_tests_properties(cli_regress_finds_real_slowdown PROPERTIES TIMEOUT 600 LABELS cli
  ENVIRONMENT "ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR}")

# `db export --out` and `db plot --out` replace their files whole or not at
# all (cli/atomic_file.c).
add_test(NAME cli_db_outputs_atomic
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_db_outputs_atomic.py $<TARGET_FILE:attnres_cli>)
set_tests_properties(cli_db_outputs_atomic PROPERTIES TIMEOUT 120 LABELS cli)

# Killed runs become 'interrupted'; regress refuses runs that did not
# complete, since their winners are partial.
add_test(NAME cli_regress_refuses_incomplete_runs
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_regress_incomplete.sh $<TARGET_FILE:attnres_cli>)
set_tests_properties(cli_regress_refuses_incomplete_runs PROPERTIES TIMEOUT 300 LABELS cli
  ENVIRONMENT "ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR}")
