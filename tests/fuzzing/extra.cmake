# Bounded fuzzing on every test run: a separate clang tree (libFuzzer with AddressSanitizer
# and UndefinedBehaviorSanitizer, CPU only) builds the fuzz targets of fuzz/ and runs each
# from the committed corpus (fuzz/corpus/<target>): the tokenizer and the template engine
# for PAGELLM_FUZZ_SECONDS, the model-file readers (config.json, safetensors header, index
# file, and the server's request bodies; small parsers that reach their depth quickly) for
# PAGELLM_FUZZ_MODEL_SECONDS. New inputs go
# to a scratch folder in the build tree, never into the committed corpus; any crash, leak
# or sanitizer report fails the test and leaves the reproducer in that folder. Needs clang
# and its compiler-rt (scripts/setup.sh installs both); without clang the test is not
# registered.
option(PAGELLM_FUZZ_TEST "Register the bounded fuzzing test (needs clang)" ON)
set(PAGELLM_FUZZ_SECONDS 45 CACHE STRING "Seconds the tokenizer and jinja targets run in the ctest")
set(PAGELLM_FUZZ_MODEL_SECONDS 20 CACHE STRING "Seconds each model-file target runs in the ctest")
find_program(PAGELLM_CLANGXX clang++)
find_program(PAGELLM_CLANG clang)
if(PAGELLM_FUZZ_TEST AND PAGELLM_CLANGXX AND PAGELLM_CLANG)
  add_test(NAME fuzz_bounded
    COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR} -DBUILD=${CMAKE_BINARY_DIR}/fuzz-tree
      -DCXX=${PAGELLM_CLANGXX} -DC=${PAGELLM_CLANG} -DGENERATOR=${CMAKE_GENERATOR}
      -DTARGETS=tokenizer_fuzz=${PAGELLM_FUZZ_SECONDS},jinja_fuzz=${PAGELLM_FUZZ_SECONDS},config_fuzz=${PAGELLM_FUZZ_MODEL_SECONDS},safetensors_fuzz=${PAGELLM_FUZZ_MODEL_SECONDS},weight_index_fuzz=${PAGELLM_FUZZ_MODEL_SECONDS},http_body_fuzz=${PAGELLM_FUZZ_MODEL_SECONDS}
      -P ${CMAKE_CURRENT_LIST_DIR}/fuzz_run.cmake)
  set_tests_properties(fuzz_bounded PROPERTIES TIMEOUT 1200)
elseif(PAGELLM_FUZZ_TEST)
  message(WARNING "clang not found: the bounded fuzzing test is not registered")
endif()
