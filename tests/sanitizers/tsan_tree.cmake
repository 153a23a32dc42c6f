# include()d by the ThreadSanitizer test scripts (tests/api/tsan.cmake,
# tests/server/tsan.cmake, tests/python/tsan.cmake) with SOURCE, BUILD, CXX, C, GENERATOR
# and TSAN_TARGETS set, LAUNCHER optional (ccache): configures the one TSan tree (CPU only,
# every library instrumented; the scripts share it, so the libraries are compiled once) and
# builds TSAN_TARGETS in it. Sets tsan_build_s. Shared modules (the Python extension) link
# with -fsanitize=thread too, so that they name the TSan runtime they were compiled for;
# they load only into a process started with that runtime preloaded. -O1 -g1 for the reason
# tests/sanitizers/asan.cmake gives: the tree is compile-bound on CI's two cores (at -O2 -g
# it took 833 s there, most of api_threadsanitizer's 900 s timeout), and a report's stack
# needs line tables only.
string(TIMESTAMP _tsan_t0 "%s")
set(_tsan_launcher "")
if(LAUNCHER)
  set(_tsan_launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER} -DCMAKE_C_COMPILER_LAUNCHER=${LAUNCHER})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_C_COMPILER=${C} -DCMAKE_BUILD_TYPE=RelWithDebInfo
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1"
    -DPAGELLM_CUDA=OFF -DPAGELLM_BENCH=OFF -DPAGELLM_TSAN_TEST=OFF -DPAGELLM_INSTALL_TEST=OFF
    "-DCMAKE_CXX_FLAGS=-fsanitize=thread" "-DCMAKE_C_FLAGS=-fsanitize=thread"
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread" "-DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=thread"
    ${_tsan_launcher}
  RESULT_VARIABLE _tsan_rc)
if(NOT _tsan_rc EQUAL 0)
  message(FATAL_ERROR "configuring the ThreadSanitizer tree failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target ${TSAN_TARGETS} -j 2
  RESULT_VARIABLE _tsan_rc)
if(NOT _tsan_rc EQUAL 0)
  message(FATAL_ERROR "building ${TSAN_TARGETS} with -fsanitize=thread failed")
endif()
string(TIMESTAMP _tsan_t1 "%s")
math(EXPR tsan_build_s "${_tsan_t1} - ${_tsan_t0}")

# Fails the test with every report ThreadSanitizer wrote into `dir` (log_path=dir/report),
# each named by its file; does nothing when there is none.
function(tsan_fail_on_reports dir)
  file(GLOB found ${dir}/report*)
  if(found)
    set(text "")
    foreach(f ${found})
      file(READ ${f} t)
      string(APPEND text "${f}:\n${t}\n")
    endforeach()
    message(FATAL_ERROR "ThreadSanitizer reported:\n${text}")
  endif()
endfunction()
