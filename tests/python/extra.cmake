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
  # The full wheel build (docs/design.md, "Python package": pip install check).
  option(PAGELLM_TEST_WHEEL "Register python_wheel_full: pip wheel . from scratch" ON)
  if(PAGELLM_TEST_WHEEL)
    add_test(NAME python_wheel_full
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/wheel_check.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
    set_tests_properties(python_wheel_full PROPERTIES TIMEOUT 3600 LABELS python
      ENVIRONMENT "PYTHON=${Python_EXECUTABLE}")
  endif()
endif()
