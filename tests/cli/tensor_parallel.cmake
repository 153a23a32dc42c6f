# cmake -DPAGELLM=... -DCACHE=... -P tensor_parallel.cmake
# `pagellm generate --tensor-parallel-size 2` on the embedded default model (made in CACHE):
# it runs (the pagellm-worker beside pagellm is found), exits 0, reports no error, and its
# greedy tokens are those of one rank.
set(ENV{PAGELLM_CACHE} ${CACHE})
foreach(tp 1 2)
  execute_process(COMMAND ${PAGELLM} generate --tensor-parallel-size ${tp} --prompt-ids 1,2,3
    --prompt-ids 7,8 --max-tokens 12 --ignore-eos --temperature 0 --json
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "generate --tensor-parallel-size ${tp} exited with ${rc}:\n${out}${err}")
  endif()
  string(REGEX MATCHALL "\"token_ids\":\\[[0-9,]+\\]" tokens_${tp} "${out}")
  list(LENGTH tokens_${tp} n)
  if(NOT n EQUAL 2)
    message(FATAL_ERROR "generate --tensor-parallel-size ${tp}: expected 2 results:\n${out}${err}")
  endif()
endforeach()
if(NOT tokens_1 STREQUAL tokens_2)
  message(FATAL_ERROR "TP 2 generated ${tokens_2}, TP 1 ${tokens_1}")
endif()
message(STATUS "TP 1 and TP 2 agree: ${tokens_2}")
