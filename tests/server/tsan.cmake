# cmake -DSOURCE=... -DBUILD=... -DCXX=... -DC=... -DGENERATOR=... -DPYTHON=... -DMINUTES=...
#       -P tsan.cmake
# See extra.cmake. Builds `pagellm` and test_server in the shared ThreadSanitizer tree, runs
# the worker pool's tests, then serves under load with control calls in the middle; any
# TSan report (the server halts on the first) fails the test.
set(TSAN_TARGETS pagellm_cli test_server)
include(${CMAKE_CURRENT_LIST_DIR}/../sanitizers/tsan_tree.cmake)
string(TIMESTAMP t1 "%s")
set(ENV{OMP_NUM_THREADS} 1)
set(ENV{OPENBLAS_NUM_THREADS} 1)

# The binary must carry the TSan runtime, or a clean run would prove nothing: the runtime
# answers help=1 with its flag list.
set(ENV{TSAN_OPTIONS} "help=1")
execute_process(COMMAND ${BUILD}/pagellm --version
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(FIND "${out}${err}" "halt_on_error" instrumented)
if(instrumented EQUAL -1)
  message(FATAL_ERROR "${BUILD}/pagellm is not built with ThreadSanitizer:\n${out}${err}")
endif()

set(reports ${BUILD}/server-tsan-reports)
file(REMOVE_RECURSE ${reports})
file(MAKE_DIRECTORY ${reports})
set(ENV{TSAN_OPTIONS}
    "halt_on_error=1:exitcode=66:second_deadlock_stack=1:log_path=${reports}/report")
execute_process(COMMAND ${BUILD}/tests/test_server --gtest_filter=WorkerPool.*
  RESULT_VARIABLE pool_rc)

# 12 clients (streams, whole responses, malformed bodies, disconnects) for MINUTES, and
# every 4 s a control call (pause keep / abort with resume, update_weights wait / keep,
# reset_prefix_cache). Worker threads end after 0.2 s idle, so threads end and start all
# the time. RSS is not judged: TSan's shadow memory grows by design.
set(ENV{PAGELLM_BIN} ${BUILD}/pagellm)
execute_process(COMMAND ${PYTHON} ${SOURCE}/scripts/soak_driver.py
    --minutes ${MINUTES} --clients 12 --control-every 4 --no-rss-check
    -- --http-threads 32 --http-thread-idle-seconds 0.2
  RESULT_VARIABLE serve_rc)
string(TIMESTAMP t2 "%s")
math(EXPR run_s "${t2} - ${t1}")
message(STATUS "server under ThreadSanitizer: build ${tsan_build_s} s, tests ${run_s} s")

tsan_fail_on_reports(${reports})
if(NOT pool_rc EQUAL 0)
  message(FATAL_ERROR "the WorkerPool tests failed under ThreadSanitizer (exit ${pool_rc})")
endif()
if(NOT serve_rc EQUAL 0)
  message(FATAL_ERROR "the server failed under ThreadSanitizer (exit ${serve_rc}; see above)")
endif()
