// The token-file parser: lists of 32-bit integers, and a clear error for anything else.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "slope/core/error.h"
#include "slope/model/token_file.h"

using namespace slope;
using namespace slope::model;

namespace {

std::string error_of(const std::string& text) {
  try {
    parse_token_ids(text, "t.txt");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a slope::Error for '" << text << "'";
  return "";
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg)

TEST(TokenFile, ParsesSeparatorsAndJson) {
  EXPECT_EQ(parse_token_ids("1 2\n3\t4,5", "t"), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(parse_token_ids("[10, 20, 30]\n", "t"), (std::vector<int32_t>{10, 20, 30}));
  EXPECT_EQ(parse_token_ids("-1,+2 2147483647 -2147483648", "t"),
            (std::vector<int32_t>{-1, 2, 2147483647, -2147483647 - 1}));
  EXPECT_TRUE(parse_token_ids(" \n,, ", "t").empty());
}

TEST(TokenFile, RejectsMalformedIds) {
  for (const char* bad : {"3-4", "1 2-", "12abc", "1.5", "--3", "+", "-", "0x10", "1;2", "3 4e5"})
    EXPECT_HAS(error_of(bad), "is not an integer token id");
  EXPECT_HAS(error_of("1 3-4"), "'3-4' at byte 2");
  EXPECT_HAS(error_of("2147483648"), "out of range (token ids are 32-bit");
  EXPECT_HAS(error_of("-2147483649"), "out of range");
  const std::string digits25(25, '9');
  EXPECT_HAS(error_of("1 " + digits25), "out of range");
  EXPECT_HAS(error_of("1 " + digits25), "t.txt");
}

}  // namespace
