// KV shard files: the prefill identity and checksums that kv-merge relies on, and the model
// fingerprint (docs/kv-format.md), checked on files written here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "slope/core/error.h"
#include "slope/engine/kv_export.h"
#include "slope/model/config.h"
#include "slope/model/safetensors.h"
#include "../error_of.h"

namespace fs = std::filesystem;
using namespace slope;

namespace {

const fs::path kModel = fs::path(SLOPE_REFERENCE_DIR) / "fixtures" / "gpt_oss" / "model";

using slope::testing::error_of;

class KvExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("slope_kv_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                                        "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    cfg_ = model::load_config(kModel.string());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A whole-prompt "prefill" of n tokens with every KV value distinct.
  engine::PrefillResult result(int64_t n) const {
    engine::PrefillResult r;
    r.shard = ops::SequenceShard::whole(n);
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      for (auto* kv : {&r.k, &r.v}) {
        Tensor t({n, cfg_.num_kv_heads, cfg_.head_dim}, DType::F32);
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(l * 1000 + i) * (kv == &r.k ? 1.f : -1.f);
        kv->push_back(t);
      }
    }
    return r;
  }
  engine::KvWriteOptions options(const std::string& prefill_id) const {
    engine::KvWriteOptions o;
    o.model_name = kModel.string();
    o.model_hash = engine::model_fingerprint(kModel.string());
    o.prefill_id = prefill_id;
    o.compute_dtype = "f32";
    return o;
  }
  std::string write(const std::string& name, const std::string& prefill_id, const std::vector<int32_t>& tokens) const {
    const std::string p = (dir_ / name).string();
    engine::write_kv_shard(p, result(int64_t(tokens.size())), tokens, cfg_, 0, options(prefill_id));
    return p;
  }

  fs::path dir_;
  model::ModelConfig cfg_;
};

TEST_F(KvExportTest, IdentityAndChecksumsRoundTrip) {
  const std::string p = write("a.safetensors", "0123456789abcdef", {1, 2, 3});
  auto f = engine::open_kv_shard(p);
  for (const char* key : {"prefill_id", "model_hash", "tokens_hash", "compute_dtype", "kv_dtype", "metadata_checksum",
                          "checksum.positions", "checksum.layers.3.v"})
    EXPECT_EQ(f->metadata().count(key), 1u) << key;
  EXPECT_EQ(f->metadata().at("prefill_id"), "0123456789abcdef");
  EXPECT_EQ(f->metadata().at("format_version"), "2");
  // FNV-1a 64 of the ids 1, 2, 3 as 4-byte little-endian integers, computed independently.
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char b : {1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0}) h = (h ^ b) * 0x100000001b3ull;
  char want[17];
  std::snprintf(want, sizeof want, "%016llx", static_cast<unsigned long long>(h));
  EXPECT_EQ(f->metadata().at("tokens_hash"), want);
}

TEST_F(KvExportTest, ShardsOfDifferentPrefillsAreTold) {
  const std::string a = write("a.safetensors", "00000000000000aa", {1, 2, 3});
  const std::string b = write("b.safetensors", "00000000000000bb", {1, 2, 3});
  const std::string c = write("c.safetensors", "00000000000000aa", {1, 2, 4});
  engine::check_same_prefill(*engine::open_kv_shard(a), *engine::open_kv_shard(a));
  std::string msg = error_of([&] { engine::check_same_prefill(*engine::open_kv_shard(a), *engine::open_kv_shard(b)); });
  EXPECT_HAS(msg, a + " and " + b + " come from different prefills (prefill_id 00000000000000aa vs 00000000000000bb)");
  msg = error_of([&] { engine::check_same_prefill(*engine::open_kv_shard(a), *engine::open_kv_shard(c)); });
  EXPECT_HAS(msg, "tokens_hash");
  EXPECT_EQ(msg.find("prefill_id"), std::string::npos) << msg;
  // Without an identity nothing is written.
  engine::KvWriteOptions o = options("");
  msg = error_of([&] { engine::write_kv_shard((dir_ / "x.safetensors").string(), result(3), {1, 2, 3}, cfg_, 0, o); });
  EXPECT_HAS(msg, "prefill identity");
}

TEST_F(KvExportTest, EditedMetadataFailsItsChecksum) {
  const std::string p = write("a.safetensors", "0123456789abcdef", {1, 2, 3});
  model::SafetensorsFile f(p);
  std::map<std::string, std::string> meta = f.metadata();
  meta["total_tokens"] = "4";  // a plausible edit that the checksums of the tensors do not see
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& n : f.names()) tensors.emplace_back(n, f.get(n));
  model::write_safetensors((dir_ / "edited.safetensors").string(), tensors, meta);
  const std::string msg = error_of([&] { engine::open_kv_shard((dir_ / "edited.safetensors").string()); });
  EXPECT_HAS(msg, "metadata checksum does not match");
}

TEST_F(KvExportTest, ModelFingerprintFollowsContentNotTimes) {
  const std::string original = engine::model_fingerprint(kModel.string());
  EXPECT_EQ(original.size(), 16u);
  const fs::path copy = dir_ / "model";
  fs::create_directories(copy);
  for (const auto& e : fs::directory_iterator(kModel)) fs::copy_file(e.path(), copy / e.path().filename());
  fs::last_write_time(copy / "model.safetensors", fs::file_time_type::clock::now() - std::chrono::hours(100));
  EXPECT_EQ(engine::model_fingerprint(copy.string()), original) << "a copy with other times must agree";
  {
    std::fstream w(copy / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    w.seekp(-1, std::ios::end);
    w.put('\x7f');
  }
  EXPECT_NE(engine::model_fingerprint(copy.string()), original) << "the last weight byte changed";
}

}  // namespace
