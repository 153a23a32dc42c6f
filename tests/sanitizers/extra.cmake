# The whole CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer: a separate
# build tree (CPU only, every library and test instrumented, -fno-sanitize-recover=all so
# that any report fails its test) whose own ctest runs everything except the tokenizer
# parity suites (Python against Hugging Face; they exercise the same code as test_tokenizer
# and take minutes) and the tests that build trees of their own (this one, the
# ThreadSanitizer and fuzzing trees, the install test). LeakSanitizer runs too: a leak
# fails the test that leaked. Suppressions (third-party code only, each with its reason)
# are in asan.supp / lsan.supp / ubsan.supp beside this file.
option(PAGELLM_ASAN_TEST "Register the ASan + UBSan build of the whole test suite" ON)
if(PAGELLM_ASAN_TEST AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_test(NAME suite_address_sanitizer
    COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR} -DBUILD=${CMAKE_BINARY_DIR}/asan
      -DCXX=${CMAKE_CXX_COMPILER} -DC=${CMAKE_C_COMPILER} -DGENERATOR=${CMAKE_GENERATOR}
      -DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER} -DSUPPRESSIONS=${CMAKE_CURRENT_LIST_DIR}
      -P ${CMAKE_CURRENT_LIST_DIR}/asan.cmake)
  # A guard against a hang, not a speed target: on 2026-12-05 the build and the run took
  # 1,994 s of a 3,744 s CI replica (2,279 s in the CI run before), beside the other trees.
  set_tests_properties(suite_address_sanitizer PROPERTIES TIMEOUT 3200)
endif()
