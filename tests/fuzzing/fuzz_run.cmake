# cmake -DSOURCE=... -DBUILD=... -DCXX=clang++ -DC=clang -DGENERATOR=... -DSECONDS=N
#       -DTARGETS="a;b" -P fuzz_run.cmake      (see extra.cmake)
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_C_COMPILER=${C} -DPAGELLM_FUZZ=ON -DPAGELLM_CUDA=OFF
    -DPAGELLM_TESTS=OFF -DPAGELLM_BENCH=OFF
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the fuzzing tree with ${CXX} failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target ${TARGETS} -j 2
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building ${TARGETS} failed")
endif()
string(TIMESTAMP t1 "%s")
math(EXPR build_s "${t1} - ${t0}")
message(STATUS "fuzz targets built in ${build_s} s")
foreach(target ${TARGETS})
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
