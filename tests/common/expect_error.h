// Expects a call to throw pagellm::Error with a given piece of message (the tests' usual
// check of an error path: the message must name what was wrong), or returns the message.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "pagellm/common/check.h"

namespace pagellm::testing {

/// Expects `fn` to throw pagellm::Error whose message contains `needle`.
template <class Fn>
void expect_error(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

/// The message of the pagellm::Error that `fn` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace pagellm::testing
