#include "slope/parallel/agreement.h"

#include <climits>
#include <cstdint>

namespace slope::parallel {

AgreedError agree_on_error(Communicator& comm, const std::string& local_error) {
  AgreedError out;
  if (comm.size() == 1) {
    if (!local_error.empty()) out = {0, local_error};
    return out;
  }
  // The lowest failing rank: the maximum of -rank over the ranks that failed.
  int64_t neg_first = local_error.empty() ? INT64_MIN : -int64_t(comm.rank());
  comm.allreduce(&neg_first, 1, ReduceOp::Max);
  if (neg_first == INT64_MIN) return out;
  out.rank = int(-neg_first);
  int64_t length = out.rank == comm.rank() ? int64_t(local_error.size()) : 0;
  comm.broadcast(&length, 1, out.rank);
  out.message = out.rank == comm.rank() ? local_error : std::string(size_t(length), ' ');
  comm.broadcast_bytes(out.message.data(), size_t(length), out.rank);
  return out;
}

}  // namespace slope::parallel
