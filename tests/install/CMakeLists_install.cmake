# tests/install: the installed package works for an engine built outside the
# tree (pkg-config and find_package, shared and static), and the example
# engine passes in the tree.
add_test(NAME install_package_builds_examples_out_of_tree
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_install.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
set_tests_properties(install_package_builds_examples_out_of_tree PROPERTIES TIMEOUT 900 LABELS install
  ENVIRONMENT "ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")

# Each runs the forward pass and a training step (forward, loss, backward,
# gradients against the fp64 reference) on the built-in kernels.
foreach(form phase mix)
  foreach(dtype f32 bf16)
    add_test(NAME example_k3_engine_${form}_${dtype}
      COMMAND $<TARGET_FILE:k3_engine> --form ${form} --dtype ${dtype} --tokens 3 --train)
    set_tests_properties(example_k3_engine_${form}_${dtype} PROPERTIES TIMEOUT 300 LABELS example
      ENVIRONMENT "ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
  endforeach()
endforeach()
# The same engine planned from the suite's tuned database: the ci preset's
# f32 mix at d = 256 and N = 5 serves the 24 sites of N = 5 from the exact
# device; the rest, and the backward plans, fall back.
add_test(NAME example_k3_engine_train_tuned_db
  COMMAND $<TARGET_FILE:k3_engine> --form mix --dtype f32 --tokens 3 --train --db ${ci_db})
set_tests_properties(example_k3_engine_train_tuned_db PROPERTIES TIMEOUT 300 LABELS example
  FIXTURES_REQUIRED ci_db PASS_REGULAR_EXPRESSION "model load: 186 plans [^\n]*: [1-9][0-9]* exact[^\n]*\n.*\nPASS\n"
  ENVIRONMENT "ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
