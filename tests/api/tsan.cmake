# cmake -DSOURCE=... -DBUILD=... -DCXX=... -DC=... -DGENERATOR=... -P tsan.cmake
# See extra.cmake. Configures (once) and builds test_api with -fsanitize=thread, then runs
# the deliberate race (must be caught) and the AsyncEngine tests (must be clean).
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_C_COMPILER=${C} -DCMAKE_BUILD_TYPE=RelWithDebInfo
    -DPAGELLM_CUDA=OFF -DPAGELLM_BENCH=OFF -DPAGELLM_TSAN_TEST=OFF -DPAGELLM_INSTALL_TEST=OFF
    "-DCMAKE_CXX_FLAGS=-fsanitize=thread" "-DCMAKE_C_FLAGS=-fsanitize=thread"
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the ThreadSanitizer tree failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target test_api -j 2
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building test_api with -fsanitize=thread failed")
endif()
string(TIMESTAMP t1 "%s")
set(ENV{OMP_NUM_THREADS} 1)
set(ENV{OPENBLAS_NUM_THREADS} 1)
set(ENV{TSAN_OPTIONS} "halt_on_error=1:second_deadlock_stack=1")
execute_process(COMMAND ${BUILD}/tests/test_api --gtest_also_run_disabled_tests
    --gtest_filter=TsanSelfCheck.*
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(FIND "${err}" "ThreadSanitizer: data race" caught)
if(rc EQUAL 0 OR caught EQUAL -1)
  message(FATAL_ERROR "ThreadSanitizer did not catch the deliberate race (exit ${rc}):\n"
    "${out}${err}")
endif()
execute_process(COMMAND ${BUILD}/tests/test_api --gtest_filter=AsyncEngine.*
  RESULT_VARIABLE rc)
string(TIMESTAMP t2 "%s")
math(EXPR build_s "${t1} - ${t0}")
math(EXPR run_s "${t2} - ${t1}")
message(STATUS "ThreadSanitizer: build ${build_s} s, tests ${run_s} s")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the AsyncEngine tests failed under ThreadSanitizer (exit ${rc})")
endif()
