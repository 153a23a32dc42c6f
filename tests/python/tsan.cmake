# cmake -DSOURCE=... -DBUILD=... -DCXX=... -DC=... -DGENERATOR=... -DPYTHON=... -DCLI=...
#       [-DLAUNCHER=ccache] -P tsan.cmake
# See extra.cmake. Builds the extension (pagellm._core) in the shared ThreadSanitizer tree,
# runs CPython with the TSan runtime preloaded, requires a deliberate race through the
# extension to be reported, then runs the Python package's concurrency tests; any report
# fails the test. CLI: an uninstrumented `pagellm` (make-lora for the LoRA tests).
set(TSAN_TARGETS pagellm_python)
include(${CMAKE_CURRENT_LIST_DIR}/../sanitizers/tsan_tree.cmake)
string(TIMESTAMP t1 "%s")

# The interpreter itself, not a launcher script (pyenv's shims are bash scripts, which the
# preloaded runtime would start in too), and the runtime the module was compiled against.
execute_process(COMMAND ${PYTHON} -c "import sys; print(sys.executable)"
  OUTPUT_VARIABLE python OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${python}")
  message(FATAL_ERROR "cannot find the interpreter behind ${PYTHON} (got '${python}')")
endif()
execute_process(COMMAND ${CXX} -print-file-name=libtsan.so
  OUTPUT_VARIABLE libtsan OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT IS_ABSOLUTE "${libtsan}" OR NOT EXISTS "${libtsan}")
  message(FATAL_ERROR "${CXX} -print-file-name=libtsan.so found no runtime (got '${libtsan}')")
endif()

# OpenMP (libgomp) and OpenBLAS are not instrumented; one thread each (tests/api/extra.cmake
# says why). PAGELLM_SOURCE_DIR / PAGELLM_BINARY_DIR as the plain python_* tests get them.
set(ENV{LD_PRELOAD} ${libtsan})
set(ENV{PYTHONPATH} ${BUILD}/python)
set(ENV{PYTHONDONTWRITEBYTECODE} 1)
set(ENV{OMP_NUM_THREADS} 1)
set(ENV{OPENBLAS_NUM_THREADS} 1)
set(ENV{PAGELLM_SOURCE_DIR} ${SOURCE})
set(ENV{PAGELLM_BINARY_DIR} ${BUILD})
set(ENV{PAGELLM_CLI} ${CLI})
set(reports ${BUILD}/python-tsan-reports)
file(REMOVE_RECURSE ${reports})
file(MAKE_DIRECTORY ${reports})
set(options "halt_on_error=1:exitcode=66:second_deadlock_stack=1")
set(options "${options}:suppressions=${CMAKE_CURRENT_LIST_DIR}/tsan.supp")

# 1. The deliberate race must be reported (the module is instrumented, the runtime loaded
#    into CPython, and the GIL released around the engine call). The longest access history
#    (history_size=7), so that the report can name the main thread's read too; when the
#    runtime still cannot restore that stack ("failed to restore the stack"), a race between
#    the engine's page allocator and a read by the main thread, which does nothing else, is
#    the deliberate one.
set(ENV{TSAN_OPTIONS} "${options}:history_size=7:log_path=${reports}/self-check")
execute_process(COMMAND ${python} -c
    "import sys, pagellm; print(pagellm.make_model(sys.argv[1], preset='tiny', seed=0))"
    ${reports}/tiny
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "make_model under ThreadSanitizer failed (exit ${rc}):\n${out}${err}")
endif()
execute_process(COMMAND ${python} ${CMAKE_CURRENT_LIST_DIR}/tsan_self_check.py ${reports}/tiny
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(GLOB found ${reports}/self-check*)
set(text "")
foreach(f ${found})
  file(READ ${f} t)
  string(APPEND text "${t}")
endforeach()
string(FIND "${text}" "ThreadSanitizer: data race" caught)
string(FIND "${text}" "num_free" where)
if(where EQUAL -1)
  string(FIND "${text}" "PageAllocator" allocator)
  string(FIND "${text}" "by main thread" main_read)
  if(NOT allocator EQUAL -1 AND NOT main_read EQUAL -1)
    set(where ${allocator})
  endif()
endif()
if(rc EQUAL 0 OR caught EQUAL -1 OR where EQUAL -1)
  message(FATAL_ERROR "ThreadSanitizer did not report the deliberate race through pagellm._core "
    "(exit ${rc}):\n${out}${err}${text}")
endif()
file(REMOVE ${found})

# 2. The package's concurrency tests: threads into LLM and AsyncLLM, asyncio streams with
#    aborts, weight updates, pause and sleep while generating, adapters loaded by streams.
set(ENV{TSAN_OPTIONS} "${options}:log_path=${reports}/report")
execute_process(COMMAND ${python} -m pytest -q -p no:cacheprovider
    test_threads.py test_async.py test_llm.py::test_threads_take_turns
    test_lora.py::test_async_llm_with_adapter
    test_lora.py::test_async_streams_naming_one_new_adapter_load_it_once
  WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR}
  RESULT_VARIABLE rc)
string(TIMESTAMP t2 "%s")
math(EXPR run_s "${t2} - ${t1}")
message(STATUS "Python package under ThreadSanitizer: build ${tsan_build_s} s, tests ${run_s} s")

tsan_fail_on_reports(${reports})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the Python concurrency tests failed under ThreadSanitizer (exit ${rc})")
endif()
