# The AsyncEngine tests under ThreadSanitizer: a separate build tree (CPU only, every
# library instrumented) that builds only test_api and runs its multi-threaded tests with
# halt_on_error, so that any race reported fails the test. OpenMP's runtime (libgomp) and
# OpenBLAS are not instrumented, and TSan cannot see the synchronisation inside their
# thread pools, so their parallel regions would be reported as false races: the run sets
# OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 (the engine loop, the callers and the
# streams, which are what is under test, are ordinary std::threads). The script first runs
# a deliberate race and requires TSan to catch it, which proves the tree is instrumented.
# The timeout (as the server's and the Python module's TSan tests have) covers building the
# shared TSan tree, which whichever of the three runs first does while CI's two cores also
# build the AddressSanitizer and fuzzing trees: it guards against a hang, not for speed.
option(PAGELLM_TSAN_TEST "Register the ThreadSanitizer build of the API tests" ON)
if(PAGELLM_TSAN_TEST AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_test(NAME api_threadsanitizer
    COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR} -DBUILD=${CMAKE_BINARY_DIR}/tsan
      -DCXX=${CMAKE_CXX_COMPILER} -DC=${CMAKE_C_COMPILER} -DGENERATOR=${CMAKE_GENERATOR}
      -DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
      -P ${CMAKE_CURRENT_LIST_DIR}/tsan.cmake)
  set_tests_properties(api_threadsanitizer PROPERTIES TIMEOUT 1500 RESOURCE_LOCK tsan_tree)
endif()

# The installed package from another project: install this build into a fresh prefix,
# configure and build examples/consumer against it with find_package(pagellm), make a tiny
# model and run the consumer on it.
option(PAGELLM_INSTALL_TEST "Register the install + find_package consumer test" ON)
if(PAGELLM_INSTALL_TEST)
  add_test(NAME api_install_consumer
    COMMAND ${CMAKE_COMMAND} -DBUILD=${CMAKE_BINARY_DIR} -DWORK=${CMAKE_BINARY_DIR}/install-test
      -DCONSUMER=${PROJECT_SOURCE_DIR}/examples/consumer -DPAGELLM=$<TARGET_FILE:pagellm_cli>
      -DGENERATOR=${CMAKE_GENERATOR} -DCXX=${CMAKE_CXX_COMPILER} -DC=${CMAKE_C_COMPILER}
      -P ${CMAKE_CURRENT_LIST_DIR}/install_consumer.cmake)
  set_tests_properties(api_install_consumer PROPERTIES TIMEOUT 600)
endif()
