# tests/install: the installed package works for an engine built outside the
# tree (pkg-config and find_package, shared and static), and the example
# engine passes in the tree.
add_test(NAME install_package_builds_examples_out_of_tree
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_install.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
set_tests_properties(install_package_builds_examples_out_of_tree PROPERTIES TIMEOUT 900 LABELS install
  ENVIRONMENT "ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")

foreach(form phase mix)
  foreach(dtype f32 bf16)
    add_test(NAME example_k3_engine_${form}_${dtype}
      COMMAND $<TARGET_FILE:k3_engine> --form ${form} --dtype ${dtype} --tokens 3)
    set_tests_properties(example_k3_engine_${form}_${dtype} PROPERTIES TIMEOUT 300 LABELS example
      ENVIRONMENT "ATTNRES_CACHE_DIR=${CMAKE_BINARY_DIR}/test-cache")
  endforeach()
endforeach()
