// Errors a user can cause (bad files, bad flags, bad shapes) are thrown as slope::Error with a
// message that names the problem and the fix; the CLI turns them into a non-zero exit.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace slope {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// An error caused by one request's data and raised by every rank of a mesh at the same point
// (e.g. a non-finite result, agreed by an all-reduce): the ranks are still in step afterwards,
// so a long-lived engine stays usable for the next request.
class RequestError : public Error {
 public:
  using Error::Error;
};

// Concatenates any streamable arguments into one string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

}  // namespace slope

// Checks a condition that user input can break; throws slope::Error with the message.
#define SLOPE_CHECK(cond, ...)                        \
  do {                                                \
    if (!(cond)) ::slope::fail(__VA_ARGS__);          \
  } while (0)
