// pagellm's one exception type. A vocabulary header: it includes no other pagellm header,
// and the library's lowest layer (src/pagellm/common/check.h) throws exactly this type.
#pragma once

#include <stdexcept>
#include <string>

namespace pagellm {

/// The one exception type the library throws. what() is meant for a user to read: it names
/// what was wrong with the input and what would be accepted.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace pagellm
