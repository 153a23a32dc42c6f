# cmake -DPAGELLM=... -DMODEL=... -DWORK=... -P generate_input.cmake
# `generate --input`: a batch of good and bad lines. Each line gets one result line in input
# order (errors name their line), the good ones run, and the exit status is 1.
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/in.jsonl
"{\"prompt\": \"Hello\", \"max_tokens\": 3, \"id\": \"first\"}
{\"prompt_token_ids\": [1, 2, 3], \"n\": 2, \"seed\": 4, \"max_tokens\": 2}
not json

{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 2, \"temperature\": 0}
{\"prompt\": \"x\", \"top_p\": 7}
{\"prompt_token_ids\": [1, 5000]}
{\"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 2, \"seed\": 5}
")
execute_process(COMMAND ${PAGELLM} generate --model ${MODEL} --input ${WORK}/in.jsonl
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "expected exit status 1 (some lines failed), got ${rc}:\n${out}${err}")
endif()
# Result lines hold brackets, which CMake lists do not survive: walk the text instead.
set(rest "${out}")
set(count 0)
macro(next_line var)
  string(FIND "${rest}" "\n" nl)
  if(nl EQUAL -1)
    message(FATAL_ERROR "expected more result lines after ${count}:\n${out}")
  endif()
  string(SUBSTRING "${rest}" 0 ${nl} ${var})
  math(EXPR nl "${nl} + 1")
  string(SUBSTRING "${rest}" ${nl} -1 rest)
  math(EXPR count "${count} + 1")
endmacro()
macro(expect_line re)
  next_line(line)
  if(NOT line MATCHES "${re}")
    message(FATAL_ERROR "result line ${count} does not match ${re}:\n${line}")
  endif()
endmacro()
expect_line("^{\"id\":\"first\",\"prompt_token_ids\":\\[[0-9,]+\\],\"outputs\":\\[{\"index\":0,\"text\":.*\"finish_reason\":\"length\"")
expect_line("^{\"id\":\"2\",.*\"index\":0,.*\"index\":1,")
set(two "${line}")
expect_line("^{\"id\":\"3\",\"error\":{\"line\":3,\"message\":\"line 3: not a JSON object")
expect_line("^{\"id\":\"5\",\"prompt_token_ids\":")
expect_line("^{\"id\":\"6\",\"error\":{\"line\":6,\"message\":\"line 6: invalid sampling parameters: top_p must be in \\(0, 1\\]")
expect_line("^{\"id\":\"7\",\"error\":{\"line\":7,\"message\":\"line 7: prompt token 1 has id 5000, outside the vocabulary")
expect_line("^{\"id\":\"8\",\"prompt_token_ids\":\\[1,2,3\\],\"outputs\":\\[{\"index\":0,")
set(eight "${line}")
if(NOT rest STREQUAL "")
  message(FATAL_ERROR "more result lines than requests:\n${rest}")
endif()
# Line 2's sample 1 (seed 4 + 1) against line 8 (seed 5): the n-samples seed rule through
# the batch file.
string(REGEX MATCH "\"index\":1,\"text\":\"([^\"\\\\]|\\\\.)*\",\"token_ids\":\\[[0-9,]+\\]" s1 "${two}")
string(REGEX MATCH "\"token_ids\":\\[[0-9,]+\\]" t1 "${s1}")
string(REGEX MATCH "\"token_ids\":\\[[0-9,]+\\]" t8 "${eight}")
if(NOT t1 OR NOT t1 STREQUAL t8)
  message(FATAL_ERROR "sample 1 of seed 4 (${t1}) differs from a request with seed 5 (${t8})")
endif()
