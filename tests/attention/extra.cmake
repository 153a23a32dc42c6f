# End-to-end checks of `pagellm attention-plan` (no GPU): the explain command prints the
# provider and the rule that decided. Needs register_attention_commands wired into the CLI.
if(TARGET pagellm_cli)
  set(_plan_args attention-plan --no-default-tables --heads 32 --kv-heads 8 --head-dim 128
      --page-size 16)
  # No device profile: no cuDNN, so rule 1 decides.
  add_test(NAME attention_plan_cli_no_cudnn
    COMMAND $<TARGET_FILE:pagellm_cli> ${_plan_args} --q-lens 2048,1x63)
  set_tests_properties(attention_plan_cli_no_cudnn PROPERTIES
    PASS_REGULAR_EXPRESSION "provider: +native.*rule 1 \\(domain\\): no cuDNN library is loaded")
  # An H200 with cuDNN 9.14 and no measured table: rule 4 decides (auto stays native).
  add_test(NAME attention_plan_cli_unknown_device
    COMMAND $<TARGET_FILE:pagellm_cli> ${_plan_args} --q-lens 512x8
      --device-name "NVIDIA H200" --sm-count 132 --compute-capability 9.0 --cudnn-version 9.14.0)
  set_tests_properties(attention_plan_cli_unknown_device PROPERTIES
    PASS_REGULAR_EXPRESSION "provider: +native.*rule 4 \\(device\\): no crossover table")
  # A lying declared maximum under explicit cudnn is a clear error naming rule 2.
  add_test(NAME attention_plan_cli_explicit_cudnn_error
    COMMAND $<TARGET_FILE:pagellm_cli> ${_plan_args} --q-lens 512x8 --declared-max-q 600
      --device-name "NVIDIA H200" --sm-count 132 --compute-capability 9.0 --cudnn-version 9.14.0
      --attention-backend cudnn)
  set_tests_properties(attention_plan_cli_explicit_cudnn_error PROPERTIES
    WILL_FAIL FALSE PASS_REGULAR_EXPRESSION "cannot serve this attention call: rule 2 \\(consistency\\)")
endif()

# --attention-backend on the engine commands: an unknown value is refused by the option
# parser, and cudnn on the cpu backend is a clear error (no model is needed to see either:
# make-model writes the tiny one first).
if(TARGET pagellm_cli)
  add_test(NAME attention_backend_cli_unknown_value
    COMMAND $<TARGET_FILE:pagellm_cli> generate --attention-backend flash --prompt-ids 1,2)
  set_tests_properties(attention_backend_cli_unknown_value PROPERTIES
    PASS_REGULAR_EXPRESSION "--attention-backend: flash not in \\{auto,native,cudnn\\}")
  set(_tiny ${CMAKE_CURRENT_BINARY_DIR}/attention-tiny-model)
  add_test(NAME attention_backend_cli_make_model
    COMMAND $<TARGET_FILE:pagellm_cli> make-model --preset tiny --out ${_tiny} --seed 3)
  set_tests_properties(attention_backend_cli_make_model PROPERTIES FIXTURES_SETUP attn_tiny)
  add_test(NAME attention_backend_cli_cudnn_on_cpu
    COMMAND $<TARGET_FILE:pagellm_cli> generate --model ${_tiny} --backend cpu
      --attention-backend cudnn --prompt-ids 1,2,3 --max-tokens 2)
  set_tests_properties(attention_backend_cli_cudnn_on_cpu PROPERTIES FIXTURES_REQUIRED attn_tiny
    PASS_REGULAR_EXPRESSION "--attention-backend cudnn needs the cuda backend")
  add_test(NAME attention_backend_cli_native_on_cpu
    COMMAND $<TARGET_FILE:pagellm_cli> generate --model ${_tiny} --backend cpu
      --attention-backend native --prompt-ids 1,2,3 --max-tokens 2)
  set_tests_properties(attention_backend_cli_native_on_cpu PROPERTIES FIXTURES_REQUIRED attn_tiny)
endif()

# Shape classes in the explain output: a table whose only entry is for chunks of 257-1024
# tokens over 4097-16384 keys admits chunk 512 after 8192 and names its class and entry; a
# fresh 2048-token prompt (another class) is native and the missing entry names its class.
if(TARGET pagellm_cli)
  set(_class_table ${CMAKE_CURRENT_LIST_DIR}/data/crossover-class-test.json)
  set(_class_args ${_plan_args} --table ${_class_table} --device-from-table)
  add_test(NAME attention_plan_cli_class_entry
    COMMAND $<TARGET_FILE:pagellm_cli> ${_class_args} --q-lens 512 --kv-lens 8704)
  set_tests_properties(attention_plan_cli_class_entry PROPERTIES
    PASS_REGULAR_EXPRESSION "provider: +cudnn.*class: +q257-1024 kv4097-16384 uniform \\(512 query tokens, largest query 512, largest KV 8704, query lengths equal\\)\nentry: +cuDNN measured faster in this class for work in \\[100000000, 1000000000\\]")
  add_test(NAME attention_plan_cli_class_no_entry
    COMMAND $<TARGET_FILE:pagellm_cli> ${_class_args} --q-lens 2048)
  set_tests_properties(attention_plan_cli_class_no_entry PROPERTIES
    PASS_REGULAR_EXPRESSION "provider: +native.*class: +q1025-4096 kv1025-4096 uniform.*entry: +none: the device's table has no entry for shape class q1025-4096 kv1025-4096 uniform")
  add_test(NAME attention_plan_cli_class_ragged_json
    COMMAND $<TARGET_FILE:pagellm_cli> ${_class_args} --q-lens 512,1x63 --kv-lens 8704,100x63
      --json)
  set_tests_properties(attention_plan_cli_class_ragged_json PROPERTIES
    PASS_REGULAR_EXPRESSION "\"class\": \"q257-1024 kv4097-16384 ragged\",.*\"entry\": null,.*\"provider\": \"native\"")
endif()
