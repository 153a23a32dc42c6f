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
add_test(NAME cli_generate_stop_string COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1,2
  --max-tokens 30 --temperature 0 --ignore-eos --stop e --stop a --json)
set_tests_properties(cli_generate_stop_string PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "\"finish_reason\":\"stop_string\"")

# Bad generate input: one line naming the option and the accepted range, exit 1, before
# the weights load. The model below has a real config.json and tokenizer but garbage weights,
# so an error found only after loading would be about the weights instead.
set(_bad ${CMAKE_CURRENT_BINARY_DIR}/cli-garbage-weights)
add_test(NAME cli_make_garbage_model COMMAND ${CMAKE_COMMAND} -DFROM=${_dir} -DTO=${_bad}
  -P ${CMAKE_CURRENT_LIST_DIR}/garbage_weights.cmake)
set_tests_properties(cli_make_garbage_model PROPERTIES FIXTURES_REQUIRED cli_model
  FIXTURES_SETUP cli_garbage_model)
set(_expect ${CMAKE_CURRENT_LIST_DIR}/expect_error.sh)
function(cli_generate_error name regex)
  add_test(NAME cli_generate_rejects_${name} COMMAND ${_expect} "${regex}" ${_pl} generate
    --model ${_bad} ${ARGN})
  set_tests_properties(cli_generate_rejects_${name} PROPERTIES FIXTURES_REQUIRED cli_garbage_model)
endfunction()
# Proof that the garbage is found when the weights do load:
cli_generate_error(garbage_weights_when_valid "^pagellm: error: .*safetensors" --prompt-ids 1)
cli_generate_error(temperature_negative
  "^pagellm: error: --temperature: .*temperature must be a finite number >= 0.*got -1$"
  --temperature -1)
cli_generate_error(temperature_nan "^pagellm: error: --temperature: .*finite number >= 0.*got nan$"
  --temperature nan)
cli_generate_error(top_p "^pagellm: error: --top-p: .*top_p must be in \\(0, 1\\].*got 2$" --top-p 2)
cli_generate_error(top_k "^pagellm: error: --top-k: .*top_k must be -1 or 0" --top-k -5)
cli_generate_error(min_p "^pagellm: error: --min-p: .*min_p must be in \\[0, 1\\]" --min-p 1.5)
cli_generate_error(presence_penalty "^pagellm: error: --presence-penalty: .*\\[-2, 2\\]"
  --presence-penalty 3)
cli_generate_error(repetition_penalty "^pagellm: error: --repetition-penalty: .*> 0"
  --repetition-penalty 0)
cli_generate_error(max_tokens "^pagellm: error: --max-tokens: .*max_tokens must be >= 1, got 0$"
  --max-tokens 0)
cli_generate_error(n_zero "^pagellm: error: -n: .*n \\(samples per prompt\\) must be >= 1, got 0$"
  -n 0)
cli_generate_error(seed_negative
  "^pagellm: error: --seed must be an integer in \\[0, 18446744073709551615\\], got -1$"
  --seed -1)
cli_generate_error(stop_token_negative "^pagellm: error: --stop-token-ids: .*>= 0, got -3$"
  --stop-token-ids -3)
cli_generate_error(empty_prompt "^pagellm: error: --prompt: the prompt is empty" --prompt @empty)
cli_generate_error(empty_prompt_ids "^pagellm: error: --prompt-ids: the prompt is empty"
  --prompt-ids @empty)
cli_generate_error(prompt_utf8
  "^pagellm: error: --prompt: the prompt text is not valid UTF-8: byte 2 \\(0xff\\)"
  --prompt "@b:ab\\377c")
cli_generate_error(token_outside_vocab
  "^pagellm: error: --prompt-ids: prompt token 1 has id 99999, outside the vocabulary \\[0, 1024\\)$"
  --prompt-ids 1,99999)
cli_generate_error(prompt_over_context
  "^pagellm: error: --prompt-ids: the prompt has 6 tokens but max_model_len is 4"
  --prompt-ids 1,2,3,4,5,6 --max-model-len 4)
cli_generate_error(max_model_len_over_model
  "^pagellm: error: --max-model-len: max_model_len 5000 is above the model's max_position_embeddings 2048"
  --max-model-len 5000)
cli_generate_error(input_with_prompt "^pagellm: error: --input cannot be combined with --prompt"
  --input x.jsonl --prompt hi)

# generate --input: good and bad lines; every line gets its result line, in order; exit 1.
add_test(NAME cli_generate_input COMMAND ${CMAKE_COMMAND} -DPAGELLM=$<TARGET_FILE:pagellm_cli>
  -DMODEL=${_dir} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/cli-input -P ${CMAKE_CURRENT_LIST_DIR}/generate_input.cmake)
set_tests_properties(cli_generate_input PROPERTIES FIXTURES_REQUIRED cli_model)

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
# bench runs a workload through the library (engine/benchmark.h) and prints its figures.
# Pipelined decode is bench's default (8 steps a run): the 7 decode steps are one run, the
# first launched as usual and 6 launched ahead; --pipelined-decode-steps 1 turns it off.
add_test(NAME cli_bench_tiny COMMAND ${_pl} bench --preset tiny --backend cpu --batch 2
  --prompt-len 4 --output-len 8)
set_tests_properties(cli_bench_tiny PROPERTIES PASS_REGULAR_EXPRESSION
  "pagellm bench: tiny \\(random weights\\) on cpu, batch 2, prompt 4, output 8, page 16, chunk 2048\n  prefill +[0-9.]+ tok/s  \\([0-9.]+ s\\)\n  decode +[0-9.]+ tok/s  \\(7 steps, [0-9.]+ s, median step [0-9.]+ ms, 0 in graphs, 6 launched ahead\\)\n  host gap +[0-9.]+ us per decode step .*\n  end-to-end +[0-9.]+ tok/s  \\([0-9.]+ s\\)\n  decode step reads [0-9.]+ GB weights \\+ [0-9.]+ GB KV. achieved [0-9]+ GB/s of [0-9]+ GB/s measured copy bandwidth = [0-9.]+ % \\(limit [0-9]+ tok/s\\)\n  weights +[0-9.]+ GB, plus [0-9.]+ GB packed[^\n]*\n  prefix hit +0.0 %  \\(0 of 6 prompt tokens found cached, 0 evictions\\)")
add_test(NAME cli_bench_step_by_step COMMAND ${_pl} bench --preset tiny --backend cpu
  --batch 2 --prompt-len 4 --output-len 8 --pipelined-decode-steps 1)
set_tests_properties(cli_bench_step_by_step PROPERTIES PASS_REGULAR_EXPRESSION
  "\\(7 steps, [0-9.]+ s, median step [0-9.]+ ms, 0 in graphs, 0 launched ahead\\)")
# --batch-invariant runs the workload in batch-invariant mode and says so above the figures.
add_test(NAME cli_bench_batch_invariant COMMAND ${_pl} bench --preset tiny --backend cpu
  --batch 3 --prompt-len 5 --output-len 6 --batch-invariant)
set_tests_properties(cli_bench_batch_invariant PROPERTIES PASS_REGULAR_EXPRESSION
  "pagellm bench: batch-invariant mode .*\npagellm bench: tiny \\(random weights\\) on cpu, batch 3.*\n  decode +[0-9.]+ tok/s  \\(5 steps")
# --no-prefix-caching: nothing is looked up (generate and bench share the engine flags).
add_test(NAME cli_bench_no_prefix_caching COMMAND ${_pl} bench --preset tiny --backend cpu
  --batch 1 --prompt-len 3 --output-len 2 --no-prefix-caching)
set_tests_properties(cli_bench_no_prefix_caching PROPERTIES PASS_REGULAR_EXPRESSION
  "\n  prefix hit +0.0 %  \\(0 of 0 prompt tokens found cached, 0 evictions\\)")
add_test(NAME cli_generate_no_prefix_caching COMMAND ${_pl} generate --model ${_dir}
  --prompt-ids 1,2,3 --max-tokens 3 --temperature 0 --no-prefix-caching --json)
set_tests_properties(cli_generate_no_prefix_caching PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "\"finish_reason\":\"length\"")
# --json-out appends one JSON line per run.
set(_bench_json ${CMAKE_CURRENT_BINARY_DIR}/cli-bench.jsonl)
add_test(NAME cli_bench_json COMMAND sh -c
  "rm -f \"$1\" && for i in 1 2; do \"$0\" bench --preset tiny --backend cpu --batch 1 --prompt-len 3 --output-len 2 --json-out \"$1\" >/dev/null || exit 1; done; cat \"$1\""
  ${_pl} ${_bench_json})
set(_num "[0-9.e+-]+")
set(_line "{\"backend\":\"cpu\",\"bandwidth_gbs\":${_num},\"base_decode_tok_s\":null,\"batch\":1,\"batched_tokens\":2048,\"decode_tok_s\":${_num},\"e2e_tok_s\":${_num},\"fraction_of_limit\":${_num},\"host_gap_us\":${_num},\"limit_tok_s\":${_num},\"lora_adapters\":0,\"lora_fraction_of_base\":null,\"lora_load_ms\":null,\"lora_rank\":0,\"median_step_ms\":${_num},\"model\":\"tiny \\(random weights\\)\",\"output_len\":2,\"pipelined_steps\":0,\"prefill_tok_s\":${_num},\"prefix_hit_rate\":${_num},\"prompt_len\":3}")
set_tests_properties(cli_bench_json PROPERTIES PASS_REGULAR_EXPRESSION "^${_line}\n${_line}\n$")
# LoRA in the bench (issue 19): two random rank-4 adapters across three requests, the
# workload run first without LoRA; two JSON lines, the second with the LoRA settings, the
# load times and the fraction of the base's decode tok/s.
set(_bench_lora_json ${CMAKE_CURRENT_BINARY_DIR}/cli-bench-lora.jsonl)
add_test(NAME cli_bench_lora COMMAND sh -c
  "rm -f \"$1\" && \"$0\" bench --preset tiny --backend cpu --batch 3 --prompt-len 4 --output-len 5 --lora-rank 4 --lora-adapters 2 --lora-compare --json-out \"$1\" && cat \"$1\""
  ${_pl} ${_bench_lora_json})
set(_lora_base_line "{\"backend\":\"cpu\",\"bandwidth_gbs\":${_num},\"base_decode_tok_s\":null,\"batch\":3,\"batched_tokens\":2048,\"decode_tok_s\":${_num},\"e2e_tok_s\":${_num},\"fraction_of_limit\":${_num},\"host_gap_us\":${_num},\"limit_tok_s\":${_num},\"lora_adapters\":0,\"lora_fraction_of_base\":null,\"lora_load_ms\":null,\"lora_rank\":0,[^\n]*}")
set(_lora_line "{\"backend\":\"cpu\",\"bandwidth_gbs\":${_num},\"base_decode_tok_s\":${_num},\"batch\":3,\"batched_tokens\":2048,\"decode_tok_s\":${_num},\"e2e_tok_s\":${_num},\"fraction_of_limit\":${_num},\"host_gap_us\":${_num},\"limit_tok_s\":${_num},\"lora_adapters\":2,\"lora_fraction_of_base\":${_num},\"lora_load_ms\":{\"max\":${_num},\"median\":${_num},\"min\":${_num}},\"lora_rank\":4,[^\n]*\"output_len\":5,[^\n]*}")
set_tests_properties(cli_bench_lora PROPERTIES PASS_REGULAR_EXPRESSION
  "pagellm bench: without LoRA \\(for --lora-compare\\)\n[^\n]*batch 3, prompt 4, output 5.*pagellm bench: with LoRA\n.*\n  lora        rank 4 on q, k, v, o, gate, up, down \\(alpha 8, bf16\\), 2 adapters: request i runs with adapter i % 2\n  lora load   min [0-9.]+ ms, median [0-9.]+ ms, max [0-9.]+ ms per adapter[^\n]*\n  lora / base +[0-9.]+ %  of the decode tok/s without LoRA.*\n${_lora_base_line}\n${_lora_line}\n$")
# Bad LoRA flags are named before any work (one line of output, exit 1).
function(cli_bench_error name regex)
  add_test(NAME cli_bench_rejects_${name} COMMAND ${_expect} "${regex}" ${_pl} bench
    --preset tiny --backend cpu ${ARGN})
endfunction()
cli_bench_error(lora_rank_negative
  "^pagellm: error: --lora-rank must be 0 \\(no LoRA\\) or 1..64 .*got -1$" --lora-rank -1)
cli_bench_error(lora_rank_too_big "^pagellm: error: --lora-rank must be 0 .*or 1..64 .*got 65$"
  --lora-rank 65)
cli_bench_error(lora_adapters_zero "^pagellm: error: --lora-adapters must be at least 1, got 0$"
  --lora-rank 4 --lora-adapters 0)
cli_bench_error(lora_adapters_over_slots
  "^pagellm: error: --lora-adapters 9 is more than the engine's 8 adapter slots \\(max_loras. raise it with --max-loras\\)$"
  --lora-rank 4 --lora-adapters 9)
cli_bench_error(lora_adapters_over_max_loras
  "^pagellm: error: --lora-adapters 3 is more than the engine's 2 adapter slots"
  --lora-rank 4 --lora-adapters 3 --max-loras 2)
cli_bench_error(lora_compare_without_rank "^pagellm: error: --lora-compare needs --lora-rank R"
  --lora-compare)
cli_bench_error(lora_rank_with_grpo
  "^pagellm: error: --lora-rank and --lora-compare apply to decode workloads .*--workload grpo$"
  --workload grpo --lora-rank 4)
cli_bench_error(trace_prefill_with_grpo
  "^pagellm: error: --trace-prefill applies to decode workloads, not to --workload grpo"
  --workload grpo --trace-prefill)
cli_bench_error(trace_after_without_steps
  "^pagellm: error: --trace-after 3 places a trace: give --trace-steps too$"
  --workload grpo --trace-after 3)
cli_bench_error(trace_after_with_decode
  "^pagellm: error: --trace-after applies to --workload grpo "
  --trace-steps 2 --trace-after 3)
# The default is the named workload W1; an unknown name lists the known ones.
add_test(NAME cli_bench_help COMMAND ${_pl} bench --help)
set_tests_properties(cli_bench_help PROPERTIES PASS_REGULAR_EXPRESSION
  "--workload TEXT=w1 .*w1: decode of Qwen3-4B.*--batch INT +concurrent requests \\(default: the workload's. W1: 32\\)")
add_test(NAME cli_bench_unknown_workload COMMAND ${_pl} bench --workload w9)
set_tests_properties(cli_bench_unknown_workload PROPERTIES PASS_REGULAR_EXPRESSION
  "pagellm: error: unknown workload 'w9' \\(known: w1, weight-update, grpo\\)")
add_test(NAME cli_bench_bad_output_len COMMAND ${_pl} bench --preset tiny --backend cpu --output-len 1)
set_tests_properties(cli_bench_bad_output_len PROPERTIES PASS_REGULAR_EXPRESSION
  "pagellm: error: benchmark output length must be at least 2 .*got 1")
# calibrate-attention is a library call; bad options are named before anything runs, and a
# build without CUDA says in one line that it cannot calibrate (exit 1).
add_test(NAME cli_calibrate_bad_iters COMMAND ${_pl} calibrate-attention --iters 0)
set_tests_properties(cli_calibrate_bad_iters PROPERTIES PASS_REGULAR_EXPRESSION
  "pagellm: error: calibration iterations must be at least 1, got 0")
add_test(NAME cli_calibrate_help COMMAND ${_pl} calibrate-attention --help)
set_tests_properties(cli_calibrate_help PROPERTIES PASS_REGULAR_EXPRESSION
  "--out TEXT.*--quick.*--page-sizes INT.*--margin FLOAT.*--iters INT.*--layers INT.*--seed UINT.*--device INT")
if(NOT PAGELLM_CUDA)
  add_test(NAME cli_calibrate_without_cuda COMMAND sh -c "\"$0\" calibrate-attention --quick 2>&1; echo \"exit $?\"" ${_pl})
  set_tests_properties(cli_calibrate_without_cuda PROPERTIES PASS_REGULAR_EXPRESSION
    "^pagellm: error: attention calibration needs a GPU build: this build has no CUDA backend \\(configure with -DPAGELLM_CUDA=ON and a CUDA toolkit\\)\nexit 1\n$")
endif()

# pagellm score: JSON lines of token ids in, one JSON line of logprobs per sequence out;
# bad input (too long for the context, an id outside the vocabulary, not JSON) is one
# error line naming the sequence or line.
set(_score_in ${CMAKE_CURRENT_BINARY_DIR}/score-input.jsonl)
file(WRITE ${_score_in} "[1, 2, 3, 4]\n\n{\"id\": \"a\", \"token_ids\": [5, 6, 7, 8, 9], \"prompt_length\": 3}\n")
add_test(NAME cli_score COMMAND ${_pl} score --model ${_dir} --input ${_score_in} --top-k 2)
set_tests_properties(cli_score PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "\"id\":\"1\",\"logprobs\":\\[-[0-9.e-]+,-[0-9.e-]+,-[0-9.e-]+\\],\"prompt_length\":1,\"ranks\":\\[[0-9]+,[0-9]+,[0-9]+\\],\"top_logprobs\":\\[\\[\\[[0-9]+,-?[0-9.e-]+\\],\\[.*\n{\"id\":\"a\",\"logprobs\":\\[-[0-9.e-]+,-[0-9.e-]+\\],\"prompt_length\":3")
set(_score_long ${CMAKE_CURRENT_BINARY_DIR}/score-long.jsonl)
file(WRITE ${_score_long} "[1, 2]\n[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n")
add_test(NAME cli_score_rejects_too_long COMMAND ${_expect}
  "^pagellm: error: score: sequence 1 has 10 tokens, longer than the context \\(max_model_len 8\\)"
  ${_pl} score --model ${_dir} --input ${_score_long} --max-model-len 8)
set_tests_properties(cli_score_rejects_too_long PROPERTIES FIXTURES_REQUIRED cli_model)
set(_score_vocab ${CMAKE_CURRENT_BINARY_DIR}/score-vocab.jsonl)
file(WRITE ${_score_vocab} "[1, 2, 99999999]\n")
add_test(NAME cli_score_rejects_bad_id COMMAND ${_expect}
  "^pagellm: error: score: token 2 of sequence 0 has id 99999999, outside the vocabulary"
  ${_pl} score --model ${_dir} --input ${_score_vocab})
set_tests_properties(cli_score_rejects_bad_id PROPERTIES FIXTURES_REQUIRED cli_model)
set(_score_bad ${CMAKE_CURRENT_BINARY_DIR}/score-bad.jsonl)
file(WRITE ${_score_bad} "[1, 2\n")
add_test(NAME cli_score_rejects_bad_json COMMAND ${_expect}
  "^pagellm: error: .*score-bad.jsonl line 1: not JSON" ${_pl} score --model ${_dir} --input ${_score_bad})
set_tests_properties(cli_score_rejects_bad_json PROPERTIES FIXTURES_REQUIRED cli_model)

# LoRA: make-lora writes a PEFT folder; generate --lora loads it, and bad flags are named.
set(_lora ${CMAKE_CURRENT_BINARY_DIR}/cli-tiny-lora)
add_test(NAME cli_make_lora COMMAND ${_pl} make-lora --model ${_dir} --out ${_lora} --rank 8
  --alpha 16 --targets q_proj,v_proj,down_proj --seed 2)
set_tests_properties(cli_make_lora PROPERTIES FIXTURES_REQUIRED cli_model FIXTURES_SETUP cli_lora
  PASS_REGULAR_EXPRESSION "wrote a random LoRA adapter \\(r 8, scale 2, 3 modules, seed 2\\)")
add_test(NAME cli_generate_lora COMMAND ${_pl} generate --model ${_dir} --prompt-ids 1,2,3
  --max-tokens 4 --temperature 0 --lora mine=${_lora} --json)
set_tests_properties(cli_generate_lora PROPERTIES FIXTURES_REQUIRED "cli_model;cli_lora"
  PASS_REGULAR_EXPRESSION "\"finish_reason\":\"length\"")
add_test(NAME cli_generate_lora_not_name_path COMMAND ${_expect}
  "^pagellm: error: --lora: 'mine' is not NAME=PATH" ${_pl} generate --model ${_dir}
  --prompt-ids 1 --lora mine)
set_tests_properties(cli_generate_lora_not_name_path PROPERTIES FIXTURES_REQUIRED cli_model)
add_test(NAME cli_generate_lora_missing_folder COMMAND ${_expect}
  "^pagellm: error: --lora x: LoRA adapter .*-absent is not a folder" ${_pl} generate
  --model ${_dir} --prompt-ids 1 --lora x=${_lora}-absent)
set_tests_properties(cli_generate_lora_missing_folder PROPERTIES FIXTURES_REQUIRED cli_model)
add_test(NAME cli_make_lora_bad_rank COMMAND ${_expect}
  "^pagellm: error: make-lora flags: rank r = 65 is outside the supported 1..64" ${_pl}
  make-lora --model ${_dir} --out ${_lora}-bad --rank 65)
set_tests_properties(cli_make_lora_bad_rank PROPERTIES FIXTURES_REQUIRED cli_model)
add_test(NAME cli_generate_lora_max_loras COMMAND ${_expect}
  "^pagellm: error: load_lora_adapter 'b': all 1 adapter slots are in use \\(max_loras\\)"
  ${_pl} generate --model ${_dir} --prompt-ids 1 --max-loras 1 --lora a=${_lora}
  --lora b=${_lora} --lora-name a)
set_tests_properties(cli_generate_lora_max_loras PROPERTIES FIXTURES_REQUIRED "cli_model;cli_lora")
add_test(NAME cli_generate_max_loras_negative COMMAND ${_pl} generate --model ${_dir}
  --prompt-ids 1 --max-loras -1)
set_tests_properties(cli_generate_max_loras_negative PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "--max-loras: must be >= 0 \\(adapter slots\\), got -1")

# Tensor parallelism from the command line: 2 processes (pagellm and a pagellm-worker found
# beside it) on the embedded default model generate what one does.
add_test(NAME cli_generate_tensor_parallel COMMAND ${CMAKE_COMMAND} -DPAGELLM=${_pl}
  -DCACHE=${CMAKE_CURRENT_BINARY_DIR}/cli-tp-cache -P ${CMAKE_CURRENT_LIST_DIR}/tensor_parallel.cmake)
add_test(NAME cli_generate_tensor_parallel_indivisible COMMAND ${_pl} generate --model ${_dir}
  --prompt-ids 1 --tensor-parallel-size 3)
set_tests_properties(cli_generate_tensor_parallel_indivisible PROPERTIES FIXTURES_REQUIRED cli_model
  PASS_REGULAR_EXPRESSION "pagellm: error: tensor parallel size 3 does not fit this model:\n  num_attention_heads 4 is not a multiple of 3")
