// `slope kv-merge`: assemble the per-rank KV shard files of one prefill into one file.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>

#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/core/error.h"
#include "slope/engine/kv_export.h"

namespace slope::cli {

int cmd_kv_merge(int argc, char** argv) {
  std::vector<std::string> inputs;
  std::string dir, output, layers;
  CLI::App app{"Assemble per-rank KV shards (from `slope run --kv-out DIR`) into one KV cache file",
               "slope kv-merge"};
  setup_app(app);
  app.add_option("inputs", inputs, "shard files (kv.rank<r>-of-<n>.safetensors)");
  app.add_option("--dir", dir, "take every kv.rank*-of-*.safetensors in DIR");
  app.add_option("--out", output, "merged output file (a new path or a regular file, replaced when done)")->required();
  app.add_option("--layers", layers,
                 "merge only layers FIRST-LAST (inclusive, e.g. 0-1); without it every layer of the model must be present");
  if (const int code = parse_args(app, argc, argv, "kv-merge"); code >= 0) return code;
  if (!dir.empty()) {
    SLOPE_CHECK(std::filesystem::is_directory(dir), "--dir '", dir, "' is not a directory");
    const size_t given = inputs.size();
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("kv.rank", 0) == 0 && e.path().extension() == ".safetensors")
        inputs.push_back(e.path().string());
    }
    std::sort(inputs.begin() + long(given), inputs.end());  // directory order is arbitrary; messages should not be
  }
  SLOPE_CHECK(!inputs.empty(), "no KV shard files given; pass them or --dir DIR");
  engine::KvMergeOptions opts;
  if (!layers.empty()) opts.layers = engine::parse_layer_range(layers);
  engine::merge_kv_shards(inputs, output, opts);
  std::cout << "merged " << inputs.size() << " shard(s) into " << output << "\n";
  return 0;
}

}  // namespace slope::cli
