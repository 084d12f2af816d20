// Agreement on an error: every rank reports whether its last step failed, and all learn the
// message of the lowest rank that failed. A step that may fail on some ranks only (a file missing
// on one node) must end in this, so that no rank goes on to a collective its peers never reach.
#pragma once

#include <string>

#include "slope/parallel/comm.h"

namespace slope::parallel {

struct AgreedError {
  int rank = -1;        // the lowest rank that failed; -1 if none did
  std::string message;  // its message
  bool failed() const { return rank >= 0; }
};

// Collective over `comm`. `local_error` is this rank's message, empty if it did not fail.
AgreedError agree_on_error(Communicator& comm, const std::string& local_error);

}  // namespace slope::parallel
