# Tokenizer parity with Hugging Face (tokenizers + transformers), run by Python scripts
# against pagellm_tokenizer_tool (the tokenize/detokenize/chat-template subcommands alone).
#
# The real Qwen3 tokenizer is looked up at PAGELLM_QWEN3_TOKENIZER_DIR (CMake cache variable
# or environment variable), else data/qwen3-tokenizer in the source tree, which always has it.
# The suites are skipped (ctest SKIP, exit code 77) only when python3 lacks tokenizers or
# transformers (pip install -r tests/oracles/requirements.txt).
add_executable(pagellm_tokenizer_tool ${CMAKE_CURRENT_LIST_DIR}/tool_main.cpp
  ${PROJECT_SOURCE_DIR}/src/cli/cmd_tokenize.cpp)
target_include_directories(pagellm_tokenizer_tool PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(pagellm_tokenizer_tool PRIVATE pagellm_tokenizer CLI11::CLI11 pagellm_warnings)

set(PAGELLM_QWEN3_TOKENIZER_DIR "" CACHE PATH
  "Folder with Qwen3's tokenizer.json (default: data/qwen3-tokenizer)")

# The tests run `python3` from PATH at test time (where `pip install tokenizers transformers
# jinja2` put the packages), not an interpreter fixed at configure time.
find_program(PAGELLM_PYTHON3 python3)
if(PAGELLM_PYTHON3)
  set(_tok_env
    "PAGELLM_TOKENIZER_TOOL=$<TARGET_FILE:pagellm_tokenizer_tool>"
    "PAGELLM_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    "TOKENIZERS_PARALLELISM=false")
  if(PAGELLM_QWEN3_TOKENIZER_DIR)
    list(APPEND _tok_env "PAGELLM_QWEN3_TOKENIZER_DIR=${PAGELLM_QWEN3_TOKENIZER_DIR}")
  endif()
  foreach(_suite encode decode chat unicode jinja small)
    add_test(NAME tokenizer_parity_${_suite}
      COMMAND python3 -m tokenizer.parity ${_suite}
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/tests/oracles)
    set_tests_properties(tokenizer_parity_${_suite} PROPERTIES
      ENVIRONMENT "${_tok_env}" SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "tokenizer;parity")
  endforeach()
else()
  message(WARNING "python3 not found: the tokenizer parity tests are not registered")
endif()
