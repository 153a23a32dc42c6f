# The layering is enforced by the build: each layer compiles against a view of src/ that
# holds only its own folder and the folders below it (src/CMakeLists.txt). These tests
# compile one translation unit against a layer's view: an include of a layer below must
# compile, an include of a layer above must not.
set(_layer_check ${CMAKE_CURRENT_LIST_DIR}/check_include.cmake)
function(pagellm_layer_include_test name layer header expect)
  add_test(NAME layers_${name}
    COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER}
      -DVIEW=${CMAKE_BINARY_DIR}/layers/${layer} -DCOMMON_VIEW=${CMAKE_BINARY_DIR}/layers/pagellm_common
      -DHEADER=${header} -DEXPECT=${expect} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/layers_${name}
      -P ${_layer_check})
endfunction()
pagellm_layer_include_test(kv_sees_common pagellm_kv pagellm/kv/page_table.h compiles)
pagellm_layer_include_test(kv_cannot_see_engine pagellm_kv pagellm/engine/engine.h fails)
pagellm_layer_include_test(sampling_cannot_see_kv pagellm_sampling pagellm/kv/page_table.h fails)
pagellm_layer_include_test(backend_cannot_see_engine pagellm_backend pagellm/engine/scheduler.h
  fails)
pagellm_layer_include_test(backend_cannot_see_cpu pagellm_backend pagellm/cpu/cpu_backend.h fails)
pagellm_layer_include_test(model_cannot_see_cpu pagellm_model pagellm/cpu/cpu_backend.h fails)
pagellm_layer_include_test(attention_cannot_see_backend pagellm_attention
  pagellm/backend/backend.h fails)
# The public vocabulary headers (plain types) are the one definition the layers below use;
# the public classes that pull in the engine are seen only from the api layer up.
pagellm_layer_include_test(sampling_sees_public_sampling_params pagellm_sampling
  pagellm/sampling_params.h compiles)
pagellm_layer_include_test(common_sees_public_outputs pagellm_common pagellm/outputs.h compiles)
pagellm_layer_include_test(engine_sees_public_engine_options pagellm_engine
  pagellm/engine_options.h compiles)
pagellm_layer_include_test(common_sees_public_lora_request pagellm_common
  pagellm/lora_request.h compiles)
pagellm_layer_include_test(engine_cannot_see_public_llm pagellm_engine pagellm/llm.h fails)
pagellm_layer_include_test(engine_cannot_see_public_async_engine pagellm_engine
  pagellm/async_engine.h fails)
pagellm_layer_include_test(engine_cannot_see_api pagellm_engine pagellm/api/engine_core.h fails)
pagellm_layer_include_test(api_sees_engine pagellm_api pagellm/engine/engine.h compiles)
# The HTTP server sits above the api layer: nothing below may include it.
pagellm_layer_include_test(api_cannot_see_server pagellm_api pagellm/server/server.h fails)
