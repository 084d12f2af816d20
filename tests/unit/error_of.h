// The message of the slope::Error a call throws, for tests of error messages.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "slope/core/error.h"

namespace slope::testing {

// The message of the slope::Error that f throws ("" and a test failure if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a slope::Error";
  return "";
}

}  // namespace slope::testing

// EXPECT_HAS(message, part): `part` occurs in `message`.
#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg)
