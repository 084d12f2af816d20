// `slope make-model`: write a random-weight model in HF format (config.json + safetensors).
#include <CLI/CLI.hpp>
#include <iostream>

#include "slope/cli/cli_util.h"
#include "slope/cli/commands.h"
#include "slope/core/error.h"
#include "slope/model/make_model.h"

namespace slope::cli {

int cmd_make_model(int argc, char** argv) {
  model::MakeModelOptions o;
  std::string dtype = "bf16";
  CLI::App app{"Write a random-weight model in Hugging Face format that transformers loads unchanged",
               "slope make-model"};
  setup_app(app);
  app.add_option("--arch", o.arch, "gpt-oss, llama, qwen2 or qwen3")->required();
  app.add_option("--preset", o.preset, "tiny (tests), tiny-wide (tiny with 16 query / 2 KV heads) or bench (benchmarks, ~1 GB)")->required();
  app.add_option("--seed", o.seed, "random seed");
  app.add_option("--out", o.out_dir, "output directory")->required();
  app.add_option("--dtype", dtype, "weight dtype: f32, bf16 or f16");
  app.add_flag("--mxfp4", o.mxfp4, "gpt-oss only: store expert weights as MXFP4 blocks/scales");
  if (const int code = parse_args(app, argc, argv, "make-model"); code >= 0) return code;
  if (dtype == "f32") o.dtype = DType::F32;
  else if (dtype == "bf16") o.dtype = DType::BF16;
  else if (dtype == "f16") o.dtype = DType::F16;
  else fail("--dtype must be f32, bf16 or f16, got '", dtype, "'");
  model::make_model(o);
  std::cout << "wrote " << o.arch << " (" << o.preset << ") to " << o.out_dir << "\n";
  return 0;
}

}  // namespace slope::cli
