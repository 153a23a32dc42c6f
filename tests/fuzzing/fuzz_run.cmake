# cmake -DSOURCE=... -DBUILD=... -DCXX=clang++ -DC=clang -DGENERATOR=...
#       -DTARGETS="a_fuzz=SECONDS;b_fuzz=SECONDS" -P fuzz_run.cmake      (see extra.cmake)
set(names)
foreach(entry ${TARGETS})
  string(REGEX REPLACE "=.*" "" name ${entry})
  list(APPEND names ${name})
endforeach()
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_C_COMPILER=${C} -DPAGELLM_FUZZ=ON -DPAGELLM_CUDA=OFF
    -DPAGELLM_TESTS=OFF -DPAGELLM_BENCH=OFF
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the fuzzing tree with ${CXX} failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target ${names} -j 2
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building ${names} failed")
endif()
string(TIMESTAMP t1 "%s")
math(EXPR build_s "${t1} - ${t0}")
message(STATUS "fuzz targets built in ${build_s} s")
foreach(entry ${TARGETS})
  string(REGEX REPLACE "=.*" "" target ${entry})
  string(REGEX REPLACE ".*=" "" SECONDS ${entry})
  string(REPLACE "_fuzz" "" corpus_name ${target})
  set(scratch ${BUILD}/corpus-new/${corpus_name})
  file(REMOVE_RECURSE ${scratch})
  file(MAKE_DIRECTORY ${scratch})
  execute_process(COMMAND ${BUILD}/fuzz/${target} -max_total_time=${SECONDS}
      -print_final_stats=1 -artifact_prefix=${scratch}/ ${scratch}
      ${SOURCE}/fuzz/corpus/${corpus_name}
    WORKING_DIRECTORY ${SOURCE}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX MATCH "stat::number_of_executed_units: [0-9]+" runs "${err}")
  if(NOT rc EQUAL 0)
    string(LENGTH "${err}" n)
    if(n GREATER 6000)
      math(EXPR from "${n} - 6000")
      string(SUBSTRING "${err}" ${from} 6000 err)
    endif()
    message(FATAL_ERROR "${target} failed (exit ${rc}); reproducer under ${scratch}:\n${err}")
  endif()
  if(runs STREQUAL "")
    message(FATAL_ERROR "${target} printed no statistics: did it run?\n${err}")
  endif()
  message(STATUS "${target}: ${SECONDS} s, ${runs}, no crash")
endforeach()
