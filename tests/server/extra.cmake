# The server end to end: `pagellm serve` started on free ports with a tiny model, driven by
# the real `openai` Python client (tests/server/requirements.txt, installed by
# scripts/setup.sh) and by raw HTTP for disconnects and the control calls.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET pagellm_server)
  add_test(NAME server_openai
    COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
      ${CMAKE_CURRENT_LIST_DIR}/test_openai_server.py ${CMAKE_CURRENT_LIST_DIR}/test_client.py
      ${CMAKE_CURRENT_LIST_DIR}/test_lora_server.py)
  set_tests_properties(server_openai PROPERTIES TIMEOUT 300
    ENVIRONMENT "PAGELLM_BIN=$<TARGET_FILE:pagellm_cli>;PAGELLM_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endif()
