# cmake -DCXX=... -DVIEW=<layer view> -DCOMMON_VIEW=... -DHEADER=pagellm/x/y.h
#       -DEXPECT=compiles|fails -DWORK=<dir> -P check_include.cmake
# Compiles `#include "<HEADER>"` against only VIEW (the layer's own folder and, through the
# links below it, nothing else: lower layers' views are added the way the build adds them).
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/tu.cpp "#include \"${HEADER}\"\nint main() { return 0; }\n")
# The views of every layer a target links are on its include path; list them from the
# layer's own build tree: every folder under layers/ whose links the layer may see is
# reachable only if it is one of its dependencies, so pass only this layer's view and the
# views of the layers it links (recorded by the build in layers/<target>.deps).
set(includes -I${VIEW})
if(EXISTS ${VIEW}.deps)
  file(STRINGS ${VIEW}.deps deps)
  foreach(d ${deps})
    list(APPEND includes -I${d})
  endforeach()
endif()
execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only ${includes} ${WORK}/tu.cpp
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(EXPECT STREQUAL "compiles" AND NOT rc EQUAL 0)
  message(FATAL_ERROR "${HEADER} should compile against ${VIEW}:\n${err}")
elseif(EXPECT STREQUAL "fails")
  if(rc EQUAL 0)
    message(FATAL_ERROR "${HEADER} compiled against ${VIEW}: the layer can include it")
  endif()
  string(FIND "${err}" "No such file" missing)
  if(missing EQUAL -1)
    message(FATAL_ERROR "${HEADER} failed against ${VIEW} for another reason:\n${err}")
  endif()
endif()
message(STATUS "${HEADER} against ${VIEW}: ${EXPECT} as expected")
