# The AsyncEngine tests under ThreadSanitizer: a separate build tree (CPU only, every
# library instrumented) that builds only test_api and runs its multi-threaded tests with
# halt_on_error, so that any race reported fails the test. OpenMP's runtime (libgomp) and
# OpenBLAS are not instrumented, and TSan cannot see the synchronisation inside their
# thread pools, so their parallel regions would be reported as false races: the run sets
# OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 (the engine loop, the callers and the
# streams, which are what is under test, are ordinary std::threads). The script first runs
# a deliberate race and requires TSan to catch it, which proves the tree is instrumented.
option(PAGELLM_TSAN_TEST "Register the ThreadSanitizer build of the API tests" ON)
if(PAGELLM_TSAN_TEST AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_test(NAME api_threadsanitizer
    COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR} -DBUILD=${CMAKE_BINARY_DIR}/tsan
      -DCXX=${CMAKE_CXX_COMPILER} -DC=${CMAKE_C_COMPILER} -DGENERATOR=${CMAKE_GENERATOR}
      -P ${CMAKE_CURRENT_LIST_DIR}/tsan.cmake)
  set_tests_properties(api_threadsanitizer PROPERTIES TIMEOUT 900)
endif()
