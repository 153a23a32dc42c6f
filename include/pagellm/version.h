// The library's version (the CMake project version; tests/api checks they agree).
#pragma once

#define PAGELLM_VERSION_MAJOR 0
#define PAGELLM_VERSION_MINOR 1
#define PAGELLM_VERSION_PATCH 0
#define PAGELLM_VERSION_STRING "0.1.0"

namespace pagellm {

/// The version of the library the program was compiled against, "MAJOR.MINOR.PATCH".
inline constexpr const char* kVersion = PAGELLM_VERSION_STRING;

}  // namespace pagellm
