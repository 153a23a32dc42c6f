# End-to-end checks of the pagellm program: make-model, then generate from ids and from
# text, and the errors a user sees for bad input (clear message, exit 1, no crash).
set(_pl $<TARGET_FILE:pagellm_cli>)
set(_dir ${CMAKE_CURRENT_BINARY_DIR}/cli-tiny-model)
add_test(NAME cli_make_model COMMAND ${_pl} make-model --preset tiny --out ${_dir} --seed 3 --dtype f32)
set_tests_properties(cli_make_model PROPERTIES FIXTURES_SETUP cli_model
  PASS_REGULAR_EXPRESSION "wrote tiny \\(float32, seed 3, untied\\)")
add_test(NAME cli_generate_ids COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1,2,3
  --prompt-ids 4,5 --max-tokens 5 --temperature 0.7 --seed 11 -n 2 --json)
set_tests_properties(cli_generate_ids PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "\"finish_reason\":\"length\".*\"logprobs\":\\[[-0-9.e,]+\\].*\"prompt\":1,\"prompt_tokens\":2,\"sample\":1")
add_test(NAME cli_generate_text COMMAND ${_pl} generate --model ${_dir} --prompt "Hello, pagellm"
  --max-tokens 4 --temperature 0)
set_tests_properties(cli_generate_text PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "text: +\"")
add_test(NAME cli_generate_bad_token COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1,99999)
set_tests_properties(cli_generate_bad_token PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "error: prompt token 1 has id 99999, outside the vocabulary.*1 of 1 requests were rejected")
add_test(NAME cli_generate_too_long COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1,2,3,4,5,6
  --max-model-len 4)
set_tests_properties(cli_generate_too_long PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "error: request 1 has a prompt of 6 tokens but max_model_len is 4")
add_test(NAME cli_generate_bad_ids COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1,x)
set_tests_properties(cli_generate_bad_ids PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "'x' in '1,x' is not a token id")
add_test(NAME cli_generate_missing_model COMMAND ${_pl} generate --model ${_dir}-absent)
set_tests_properties(cli_generate_missing_model PROPERTIES
  PASS_REGULAR_EXPRESSION "pagellm: error: .*config.json")
add_test(NAME cli_generate_one_page COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1 --num-pages 1)
set_tests_properties(cli_generate_one_page PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "pagellm: error: num_pages must be at least 2 \\(page 0 is reserved\\), got 1")
add_test(NAME cli_generate_bad_page_size COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1 --page-size 0)
set_tests_properties(cli_generate_bad_page_size PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "pagellm: error: page size must be in \\[1, 1024\\], got 0")
add_test(NAME cli_generate_few_pages COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1,2,3
  --num-pages 3 --page-size 1 --max-tokens 8)
set_tests_properties(cli_generate_few_pages PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "needs up to 10 KV-cache pages .* but the KV cache has only 2 pages")
# The bench's kernel trace needs CUPTI and a GPU: elsewhere it says so and the bench goes on.
add_test(NAME cli_bench_trace_unavailable COMMAND ${_pl} bench --preset tiny --backend cpu
  --batch 2 --prompt-len 4 --output-len 8 --trace-steps 2)
set_tests_properties(cli_bench_trace_unavailable PROPERTIES
  PASS_REGULAR_EXPRESSION "kernel trace unavailable: cpu backend has no kernel trace.*decode ")
# One line that is not UTF-8 among good ones: tokenize, detokenize and chat-template --jsonl
# print {"error": "line 2: ..."} in its place, go on with the next line and exit with 1.
add_test(NAME cli_tokenizer_commands_bad_line
  COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/bad_input_lines.sh ${_pl} ${_dir})
set_tests_properties(cli_tokenizer_commands_bad_line PROPERTIES FIXTURES_REQUIRED cli_model)
