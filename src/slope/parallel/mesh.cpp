#include "slope/parallel/mesh.h"

#include <sstream>

#include "slope/core/error.h"

namespace slope::parallel {

namespace {
std::string join(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

bool ulysses_ok(int u, int64_t hq, int64_t hkv) {
  if (hq <= 0) return true;
  if (hq % u != 0) return false;
  return hkv <= 0 || hkv % u == 0 || u % hkv == 0;
}

// "(1,4), (2,2), (4,1)": every (U,R) with U·R = n that the heads allow.
std::string fitting_shapes(int n, int64_t hq, int64_t hkv) {
  std::ostringstream os;
  bool first = true;
  for (int u = 1; u <= n; ++u) {
    if (n % u != 0 || !ulysses_ok(u, hq, hkv)) continue;
    os << (first ? "" : ", ") << "(" << u << "," << n / u << ")";
    first = false;
  }
  return os.str();
}
}  // namespace

void validate_mesh(const MeshShape& shape, int world_size, int64_t num_q_heads,
                   int64_t num_kv_heads, int64_t num_tokens) {
  const int U = shape.ulysses, R = shape.ring;
  SLOPE_CHECK(U >= 1 && R >= 1, "--ulysses and --ring must be at least 1 (got --ulysses ", U,
              " --ring ", R, ")");
  if (U * R != world_size)
    fail("--ulysses ", U, " --ring ", R, " needs ", U * R, " ranks, got ", world_size, "; with ",
         world_size, " ranks use (U,R) in {", fitting_shapes(world_size, num_q_heads, num_kv_heads),
         "}");
  if (num_q_heads > 0 && num_q_heads % U != 0)
    fail("--ulysses ", U, " does not divide num_attention_heads ", num_q_heads,
         "; valid --ulysses: ", join(valid_ulysses_degrees(num_q_heads, num_kv_heads)),
         " (or use --ring for the rest of the ranks)");
  if (num_q_heads > 0 && num_kv_heads > 0 && num_kv_heads % U != 0 && U % num_kv_heads != 0)
    fail("--ulysses ", U, " and num_key_value_heads ", num_kv_heads,
         " don't nest (U must divide the KV heads, or the KV heads divide U so they can be "
         "replicated); valid --ulysses: ",
         join(valid_ulysses_degrees(num_q_heads, num_kv_heads)));
  if (num_tokens < 1)
    fail("the prompt has ", num_tokens, " tokens; context parallelism needs at least 1");
}

Mesh::Mesh(Communicator& world, MeshShape shape, const DataPlaneFactory& data_plane)
    : shape_(shape), world_(&world) {
  SLOPE_CHECK(shape.pp == 1 && shape.tp == 1, "a context-parallel mesh is ring x ulysses only, got ", shape.str(),
              " (pipeline stages and tensor groups are built around it by engine::Topology)");
  validate_mesh(shape, world.size(), 0, 0, 1);
  const int w = world.rank();
  const int r = w / shape.ulysses, u = w % shape.ulysses;
  ulysses_ = world.split(/*color=*/r, /*key=*/u, "ulysses");
  ring_ = world.split(/*color=*/u, /*key=*/r, "ring");
  const DataPlaneFactory make = data_plane ? data_plane : host_data_plane();
  world_data_ = make(world);
  ring_data_ = make(*ring_);
  ulysses_data_ = make(*ulysses_);
}

void Mesh::set_timeout(double seconds) {
  world_->set_timeout(seconds);
  ring_->set_timeout(seconds);
  ulysses_->set_timeout(seconds);
}

}  // namespace slope::parallel
