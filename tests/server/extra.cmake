# The server end to end: `pagellm serve` started on free ports with a tiny model, driven by
# the real `openai` Python client (tests/server/requirements.txt, installed by
# scripts/setup.sh) and by raw HTTP for disconnects and the control calls.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET pagellm_server)
  add_test(NAME server_openai
    COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
      ${CMAKE_CURRENT_LIST_DIR}/test_openai_server.py ${CMAKE_CURRENT_LIST_DIR}/test_client.py
      ${CMAKE_CURRENT_LIST_DIR}/test_lora_server.py
      ${CMAKE_CURRENT_LIST_DIR}/test_weight_broadcast.py
      ${CMAKE_CURRENT_LIST_DIR}/test_scoring_and_parsers.py)
  set_tests_properties(server_openai PROPERTIES TIMEOUT 300
    ENVIRONMENT "PAGELLM_BIN=$<TARGET_FILE:pagellm_cli>;PAGELLM_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endif()
# The server under ThreadSanitizer (tests/server/tsan.cmake): `pagellm` and test_server
# built in the TSan tree the API test configures (build/tsan, shared, so the libraries are
# compiled once for both; the lock keeps the two tests from building it at the same time),
# then the worker pool's tests and 75 s of concurrent clients with pause, resume and weight
# updates in the middle. Any TSan report fails it.
if(Python3_FOUND AND TARGET pagellm_server AND PAGELLM_TSAN_TEST
   AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_test(NAME server_threadsanitizer
    COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR} -DBUILD=${CMAKE_BINARY_DIR}/tsan
      -DCXX=${CMAKE_CXX_COMPILER} -DC=${CMAKE_C_COMPILER} -DGENERATOR=${CMAKE_GENERATOR}
      -DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}
      -DPYTHON=${Python3_EXECUTABLE} -DMINUTES=1.25 -P ${CMAKE_CURRENT_LIST_DIR}/tsan.cmake)
  set_tests_properties(server_threadsanitizer PROPERTIES TIMEOUT 1500 RESOURCE_LOCK tsan_tree)
endif()
