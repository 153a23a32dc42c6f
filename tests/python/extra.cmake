# The Python package's pytest suites, one ctest per file, against the build tree's package
# (build/python/pagellm, see src/python/CMakeLists.txt). PAGELLM_CLI lets them compare with
# `pagellm generate --json`. Registered when the extension is built (PAGELLM_PYTHON).
if(PAGELLM_PYTHON)
  set(_py_env "PYTHONPATH=${CMAKE_BINARY_DIR}/python" "PAGELLM_CLI=$<TARGET_FILE:pagellm_cli>"
    "PAGELLM_SOURCE_DIR=${PROJECT_SOURCE_DIR}" "PAGELLM_BINARY_DIR=${CMAKE_BINARY_DIR}"
    "OMP_NUM_THREADS=2")
  file(GLOB _py_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/test_*.py)
  foreach(_file ${_py_tests})
    get_filename_component(_name ${_file} NAME_WE)
    add_test(NAME python_${_name}
      COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider ${_file}
      WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
    set_tests_properties(python_${_name} PROPERTIES ENVIRONMENT "${_py_env}" TIMEOUT 1500
      LABELS python)
  endforeach()
  # The package's concurrency under ThreadSanitizer (tests/python/tsan.cmake): the extension
  # built in the TSan tree the API and server tests share (build/tsan; the lock keeps them
  # from building it at once), CPython run with the TSan runtime preloaded, a deliberate
  # race through the extension that must be reported, then test_threads.py, test_async.py
  # and the threaded / async tests of test_llm.py and test_lora.py. Any report fails it.
  if(PAGELLM_TSAN_TEST AND CMAKE_CXX_COMPILER_ID MATCHES "GNU")
    add_test(NAME python_threadsanitizer
      COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR} -DBUILD=${CMAKE_BINARY_DIR}/tsan
        -DCXX=${CMAKE_CXX_COMPILER} -DC=${CMAKE_C_COMPILER} -DGENERATOR=${CMAKE_GENERATOR}
        -DLAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER} -DPYTHON=${Python_EXECUTABLE}
        -DCLI=$<TARGET_FILE:pagellm_cli> -P ${CMAKE_CURRENT_LIST_DIR}/tsan.cmake)
    set_tests_properties(python_threadsanitizer PROPERTIES TIMEOUT 1500 RESOURCE_LOCK tsan_tree
      LABELS python)
  endif()
  # The full wheel build (docs/design.md, "Python package": pip install check).
  option(PAGELLM_TEST_WHEEL "Register python_wheel_full: pip wheel . from scratch" ON)
  if(PAGELLM_TEST_WHEEL)
    add_test(NAME python_wheel_full
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/wheel_check.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
    set_tests_properties(python_wheel_full PROPERTIES TIMEOUT 3600 LABELS python
      ENVIRONMENT "PYTHON=${Python_EXECUTABLE}")
  endif()
endif()
