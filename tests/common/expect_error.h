// Expects a call to throw pagellm::Error with a given piece of message (the tests' usual
// check of an error path: the message must name what was wrong).
#pragma once

#include <gtest/gtest.h>

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

}  // namespace pagellm::testing
