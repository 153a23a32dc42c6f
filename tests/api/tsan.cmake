# cmake -DSOURCE=... -DBUILD=... -DCXX=... -DC=... -DGENERATOR=... -P tsan.cmake
# See extra.cmake. Configures (once) and builds test_api and test_model_forward with
# -fsanitize=thread, then runs the deliberate race (must be caught), the AsyncEngine tests
# and the tensor-parallel tests (ranks as threads of one process; both must be clean).
set(TSAN_TARGETS test_api test_model_forward)
include(${CMAKE_CURRENT_LIST_DIR}/../sanitizers/tsan_tree.cmake)
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
execute_process(COMMAND ${BUILD}/tests/test_model_forward --gtest_filter=TensorParallel.*
  RESULT_VARIABLE tp_rc)
string(TIMESTAMP t2 "%s")
math(EXPR run_s "${t2} - ${t1}")
message(STATUS "ThreadSanitizer: build ${tsan_build_s} s, tests ${run_s} s")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the AsyncEngine tests failed under ThreadSanitizer (exit ${rc})")
endif()
if(NOT tp_rc EQUAL 0)
  message(FATAL_ERROR "the tensor-parallel tests failed under ThreadSanitizer (exit ${tp_rc})")
endif()
