#include "slope/serve/mesh_spec.h"

#include <set>
#include <sstream>

#include "slope/core/error.h"

namespace slope::serve {

engine::ParallelShape parse_mesh_spec(const std::string& text) {
  engine::ParallelShape m;
  std::set<std::string> seen;
  std::stringstream ss(text);
  std::string entry;
  const std::string hint = "write it as \"pp=1,ring=2,ulysses=1,tp=1\" (keys pp, ring, ulysses, tp, pp_chunk)";
  SLOPE_CHECK(!text.empty(), "an instance's mesh is empty; ", hint);
  while (std::getline(ss, entry, ',')) {
    const size_t eq = entry.find('=');
    SLOPE_CHECK(eq != std::string::npos, "instance mesh \"", text, "\": entry \"", entry, "\" has no '='; ", hint);
    const std::string key = entry.substr(0, eq), value = entry.substr(eq + 1);
    SLOPE_CHECK(seen.insert(key).second, "instance mesh \"", text, "\": ", key, " is given twice");
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SLOPE_CHECK(used == value.size() && !value.empty(), "instance mesh \"", text, "\": ", key, "=", value,
                " is not an integer");
    if (key == "pp_chunk") {
      SLOPE_CHECK(v >= 0, "instance mesh \"", text, "\": pp_chunk must be 0 (whole prompt) or positive");
      m.pp_chunk = v;
      continue;
    }
    SLOPE_CHECK(v >= 1 && v <= 4096, "instance mesh \"", text, "\": ", key, " must be in [1, 4096], got ", v);
    if (key == "pp") m.pp = int(v);
    else if (key == "ring") m.ring = int(v);
    else if (key == "ulysses") m.ulysses = int(v);
    else if (key == "tp") m.tp = int(v);
    else fail("instance mesh \"", text, "\": unknown key ", key, "; ", hint);
  }
  return m;
}

std::string mesh_spec(const engine::ParallelShape& m) {
  return str_cat("pp=", m.pp, ",ring=", m.ring, ",ulysses=", m.ulysses, ",tp=", m.tp);
}

}  // namespace slope::serve
