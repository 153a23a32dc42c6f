// Errors and invariants.
//
// Inside the library, a violated precondition or bad input throws pagellm::Error with a
// message that names what was wrong. PAGELLM_CHECK is for conditions that bad input can
// break (always on); PAGELLM_ASSERT documents internal invariants (also always on: the
// cost is a predictable branch and the benefit is a clear message instead of corruption).
#pragma once

#include <sstream>
#include <string>

// pagellm::Error, the one exception type the library throws, is public.
#include "pagellm/error.h"

namespace pagellm {

namespace detail {
// Collects a message with operator<< and throws it when destroyed at the end of the
// full expression: PAGELLM_CHECK(x > 0) << "x must be positive, got " << x;
class Thrower {
 public:
  Thrower(const char* prefix) { stream_ << prefix; }
  template <class T>
  Thrower& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  [[noreturn]] ~Thrower() noexcept(false) { throw Error(stream_.str()); }

 private:
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace pagellm

#define PAGELLM_CHECK(cond) \
  if (cond) {               \
  } else                    \
    ::pagellm::detail::Thrower("")

#define PAGELLM_ASSERT(cond)                                                          \
  if (cond) {                                                                         \
  } else                                                                              \
    ::pagellm::detail::Thrower("internal error: " #cond " failed at " __FILE__ ":") \
        << __LINE__ << ": "

#define PAGELLM_FAIL() ::pagellm::detail::Thrower("")
