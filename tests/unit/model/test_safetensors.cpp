// Safetensors reading, validation and writing; WeightStore over single and sharded checkpoints.
// Malformed files are written byte by byte here; every one must give a slope::Error whose
// message names the problem, never a crash (these tests also run under ASan/UBSan).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "slope/core/error.h"
#include "slope/core/sys.h"
#include "slope/model/safetensors.h"
#include "../error_of.h"

namespace fs = std::filesystem;
using namespace slope;
using namespace slope::model;

namespace {

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("slope_st_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes an 8-byte little-endian length, the header text and the data bytes.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        uint64_t declared_len = UINT64_MAX) {
    const uint64_t len = declared_len == UINT64_MAX ? header.size() : declared_len;
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = char(len >> (8 * i));
    bytes += header;
    bytes += data;
    return write_bytes(name, bytes);
  }
  std::string write_bytes(const std::string& name, const std::string& bytes) {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  fs::path dir_;
};

using slope::testing::error_of;

Tensor iota_tensor(Shape shape, DType dt) {
  Tensor t(std::move(shape), dt);
  auto* b = t.data<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i) b[i] = uint8_t(i * 7 + 3);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Malformed files

TEST_F(SafetensorsTest, FileShorterThanHeaderLength) {
  for (size_t n : {0, 1, 7}) {
    std::string p = write_bytes("short.safetensors", std::string(n, 'x'));
    std::string msg = error_of([&] { SafetensorsFile f(p); });
    EXPECT_HAS(msg, p);
    EXPECT_HAS(msg, "shorter than the 8-byte header length");
  }
}

TEST_F(SafetensorsTest, MissingFile) {
  std::string msg = error_of([&] { SafetensorsFile f(path("absent.safetensors")); });
  EXPECT_HAS(msg, "absent.safetensors");
  EXPECT_HAS(msg, "cannot open");
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFile) {
  std::string p = write_raw("t.safetensors", "{}", "", 1000);
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "header length 1000 runs past the end of the file");
  // An absurd length (a text file, say) is caught the same way, before any allocation.
  p = write_raw("t2.safetensors", "{}", "", uint64_t(1) << 62);
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "runs past the end");
  // A header truncated mid-way: length says 40, the file holds 20 bytes of it.
  p = write_bytes("t3.safetensors", std::string("\x28\0\0\0\0\0\0\0", 8) + "{\"a\": {\"dtype\": \"F3");
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "runs past the end");
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  std::string p = write_raw("t.safetensors", "{\"a\": {\"dtype\": ", "");
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "not valid JSON");
}

TEST_F(SafetensorsTest, HeaderNotObject) {
  std::string p = write_raw("t.safetensors", "[1, 2, 3]", "");
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "expected an object");
}

TEST_F(SafetensorsTest, EntryMissingFields) {
  const std::pair<const char*, const char*> cases[] = {
      {"dtype", R"({"shape": [2], "data_offsets": [0, 8]})"},
      {"shape", R"({"dtype": "F32", "data_offsets": [0, 8]})"},
      {"data_offsets", R"({"dtype": "F32", "shape": [2]})"},
  };
  for (const auto& [field, entry] : cases) {
    std::string p = write_raw("t.safetensors", std::string("{\"my.weight\": ") + entry + "}", std::string(8, '\0'));
    std::string msg = error_of([&] { SafetensorsFile f(p); });
    EXPECT_HAS(msg, "my.weight");
    EXPECT_HAS(msg, std::string("no '") + field + "' field");
  }
}

TEST_F(SafetensorsTest, EntryWrongJsonTypes) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("just a string")", "expected an object"},
      {R"({"dtype": 5, "shape": [2], "data_offsets": [0, 8]})", "'dtype' is JSON number"},
      {R"({"dtype": "F32", "shape": "2", "data_offsets": [0, 8]})", "'shape' is JSON string"},
      {R"({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]})", "shape dimension 0 is -2"},
      {R"({"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]})", "expected a non-negative integer"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0]})", "'data_offsets'"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": {"a": 1}})", "'data_offsets'"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]})", "'data_offsets'"},
  };
  for (const auto& [entry, expect] : cases) {
    std::string p = write_raw("t.safetensors", std::string("{\"w\": ") + entry + "}", std::string(8, '\0'));
    std::string msg = error_of([&] { SafetensorsFile f(p); });
    EXPECT_HAS(msg, "tensor 'w'");
    EXPECT_HAS(msg, expect);
  }
}

TEST_F(SafetensorsTest, UnknownDtype) {
  std::string p = write_raw("t.safetensors", R"({"layer.w": {"dtype": "F8_E9", "shape": [2], "data_offsets": [0, 2]}})",
                            std::string(2, '\0'));
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "layer.w");
  EXPECT_HAS(msg, "dtype 'F8_E9'");
  EXPECT_HAS(msg, "not supported");
}

TEST_F(SafetensorsTest, OffsetsOutsideDataRegion) {
  std::string p = write_raw("t.safetensors", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                            std::string(8, '\0'));
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "tensor 'w'");
  EXPECT_HAS(msg, "outside the data region of 8 bytes");
}

TEST_F(SafetensorsTest, OffsetsEndBeforeBegin) {
  std::string p = write_raw("t.safetensors", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})",
                            std::string(8, '\0'));
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "end before they begin");
}

TEST_F(SafetensorsTest, ByteSizeMismatch) {
  std::string p = write_raw("t.safetensors", R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
                            std::string(8, '\0'));
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "tensor 'w'");
  EXPECT_HAS(msg, "byte size 8");
  EXPECT_HAS(msg, "does not match shape [3]");
  // Dimensions whose product overflows 64 bits must not wrap around to a "matching" size.
  p = write_raw("t2.safetensors",
                R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296, 1], "data_offsets": [0, 0]}})", "");
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "overflows");
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  std::string p = write_raw("t.safetensors",
                            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                            R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                            std::string(12, '\0'));
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "overlap");
  EXPECT_HAS(msg, "'a'");
  EXPECT_HAS(msg, "'b'");
}

TEST_F(SafetensorsTest, BadMetadata) {
  std::string p = write_raw("t.safetensors", R"({"__metadata__": {"format": 1}})", "");
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_HAS(msg, "__metadata__");
  EXPECT_HAS(msg, "format");
}

// ---------------------------------------------------------------------------------------------
// Well-formed files

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::U8, DType::I32, DType::I64})
    tensors.emplace_back(std::string("t.") + std::string(dtype_name(dt)), iota_tensor({3, 5}, dt));
  tensors.emplace_back("scalar", iota_tensor({}, DType::F32));
  tensors.emplace_back("empty", Tensor({0, 4}, DType::BF16));
  tensors.emplace_back("odd_u8", iota_tensor({3}, DType::U8));  // leaves later tensors misaligned
  tensors.emplace_back("after_odd", iota_tensor({2, 2}, DType::F32));
  const std::string p = path("rt.safetensors");
  write_safetensors(p, tensors, {{"format", "pt"}, {"note", "round trip"}});

  // The header is space-padded so that the data starts 8-byte aligned, as HF writes it.
  std::ifstream in(p, std::ios::binary);
  uint8_t len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = len << 8 | len_bytes[i];
  EXPECT_EQ(len % 8, 0u);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  SafetensorsFile f(p);
  EXPECT_EQ(f.names().size(), tensors.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "round trip");
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(f.contains(name)) << name;
    Tensor r = f.get(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    ASSERT_EQ(r.nbytes(), t.nbytes()) << name;
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(r.raw(), t.raw(), t.nbytes()), 0) << name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(r.raw()) % dtype_size(r.dtype()), 0u) << name << " misaligned";
    }
  }
  EXPECT_FALSE(f.contains("nope"));
  std::string msg = error_of([&] { f.get("nope"); });
  EXPECT_HAS(msg, "nope");
}

TEST_F(SafetensorsTest, ViewOutlivesFile) {
  const std::string p = path("v.safetensors");
  Tensor src = iota_tensor({64}, DType::F32);
  write_safetensors(p, {{"w", src}});
  Tensor view;
  {
    SafetensorsFile f(p);
    view = f.get("w");
  }
  // The mapping is kept alive by the view (ASan would flag a use after unmap).
  EXPECT_EQ(std::memcmp(view.raw(), src.raw(), src.nbytes()), 0);
  Tensor f32 = view.to_f32();
  EXPECT_EQ(f32.numel(), 64);
}

// release_pages takes a loaded file's pages out of the process's RSS, and a view read afterwards
// still holds the same bytes (faulted back in from the file).
TEST_F(SafetensorsTest, ReleasedPagesLeaveTheRssAndReadBackTheSame) {
  const std::string p = path("big.safetensors");
  const int64_t n = int64_t{48} << 18;  // 48 MiB of f32
  Tensor src({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) src.data<float>()[i] = float(i % 65521) - 7.f;
  write_safetensors(p, {{"w", src}});
  SafetensorsFile f(p);
  const Tensor view = f.get("w");
  const auto checksum = [&] {
    double s = 0;
    for (int64_t i = 0; i < n; i += 97) s += view.data<float>()[i] * double(i % 13 + 1);
    return s;
  };
  const double before = checksum();  // touches every page of the tensor's 48 MiB
  EXPECT_EQ(std::memcmp(view.raw(), src.raw(), src.nbytes()), 0);
  const int64_t resident = current_rss_bytes();
  f.release_pages();
  const int64_t released = current_rss_bytes();
  EXPECT_GE(resident - released, int64_t(src.nbytes()) * 9 / 10)
      << "RSS " << resident << " -> " << released << " bytes";
  EXPECT_EQ(checksum(), before);
  EXPECT_EQ(std::memcmp(view.raw(), src.raw(), src.nbytes()), 0);
}

TEST_F(SafetensorsTest, ReadsHandWrittenHeaderWithPadding) {
  // Trailing spaces (HF padding) and a null __metadata__ are legal.
  float vals[2] = {1.5f, -2.0f};
  std::string data(8, '\0');
  std::memcpy(&data[0], vals, 8);
  std::string p = write_raw("t.safetensors",
                            R"({"__metadata__": null, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}   )",
                            data);
  SafetensorsFile f(p);
  Tensor w = f.get("w");
  EXPECT_EQ(w.data<float>()[0], 1.5f);
  EXPECT_EQ(w.data<float>()[1], -2.0f);
}

// Regression (issue 15, defect 4): the tensors must tile the data region exactly, and the
// header may be padded with spaces only. A gap, bytes after the last tensor or a first tensor
// that does not start at 0 were accepted before.
TEST_F(SafetensorsTest, TensorsMustTileTheDataRegion) {
  const std::string a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": )";
  const std::string b = R"("b": {"dtype": "U8", "shape": [4], "data_offsets": )";
  std::string msg = error_of([&] {
    SafetensorsFile f(write_raw("gap.safetensors", "{" + a + "[0, 8]}, " + b + "[10, 14]}}", std::string(14, '\0')));
  });
  EXPECT_HAS(msg, "gap of 2 bytes after tensor 'a'");
  msg = error_of([&] {
    SafetensorsFile f(write_raw("start.safetensors", "{" + a + "[4, 12]}}", std::string(12, '\0')));
  });
  EXPECT_HAS(msg, "gap of 4 bytes after the header");
  msg = error_of([&] {
    SafetensorsFile f(write_raw("tail.safetensors", "{" + a + "[0, 8]}}", std::string(11, '\0')));
  });
  EXPECT_HAS(msg, "end at byte 8 of a data region of 11 bytes");
  for (const std::string& pad : {std::string("\n"), std::string("\t "), std::string("  \r  ")}) {
    msg = error_of([&] {
      SafetensorsFile f(write_raw("pad.safetensors", "{" + a + "[0, 8]}}" + pad, std::string(8, '\0')));
    });
    EXPECT_HAS(msg, "followed only by spaces");
  }
  for (const std::string& pad : {std::string("  x"), std::string(1, '\0')}) {
    msg = error_of([&] {
      SafetensorsFile f(write_raw("pad.safetensors", "{" + a + "[0, 8]}}" + pad, std::string(8, '\0')));
    });
    EXPECT_HAS(msg, "header");  // "not valid JSON" or "followed only by spaces", as the parser sees it
  }
  msg = error_of([&] { SafetensorsFile f(write_raw("lead.safetensors", " {" + a + "[0, 8]}}", std::string(8, '\0'))); });
  EXPECT_HAS(msg, "begin with '{'");
}

// Regression (issue 15, defect 4): a header length a few bytes off its true value. With the
// padding spaces the JSON still parsed when the length was 2 short, and every tensor was read
// 2 bytes early. Every shift must be rejected; the true length must read back the values.
TEST_F(SafetensorsTest, ShiftedHeaderLengthIsRejected) {
  const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                             R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})" + std::string(6, ' ');
  const float vals[3] = {1.0f, 2.0f, 3.0f};
  std::string data(12, '\0');
  std::memcpy(data.data(), vals, 12);
  {
    SafetensorsFile good(write_raw("good.safetensors", header, data));
    EXPECT_EQ(good.get("b").data<float>()[0], 3.0f);
  }
  for (int shift : {-6, -4, -2, -1, 1, 2, 3}) {
    const std::string p = write_raw("shift.safetensors", header, data, uint64_t(int64_t(header.size()) + shift));
    const std::string msg = error_of([&] { SafetensorsFile f(p); });
    EXPECT_FALSE(msg.empty()) << "header length shifted by " << shift << " was accepted";
    EXPECT_HAS(msg, "shift.safetensors");
  }
  const std::string msg = error_of([&] { SafetensorsFile f(write_raw("m2.safetensors", header, data, header.size() - 2)); });
  EXPECT_HAS(msg, "tile the data region");
}

TEST_F(SafetensorsTest, WriterRejectsMismatchAndLeavesNoPartialFile) {
  const std::string p = path("w.safetensors");
  {
    SafetensorsWriter w(p, {{"a", DType::F32, {2}}, {"b", DType::BF16, {3}}});
    w.append(Tensor({2}, DType::F32));
    std::string msg = error_of([&] { w.append(Tensor({4}, DType::BF16)); });
    EXPECT_HAS(msg, "'b'");
    EXPECT_HAS(msg, "declared as BF16 [3]");
    msg = error_of([&] { w.finish(); });
    EXPECT_HAS(msg, "only 1 of 2");
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  std::string msg = error_of([&] { write_safetensors(path("no/such/dir/x.safetensors"), {{"a", Tensor({1}, DType::F32)}}); });
  EXPECT_HAS(msg, "cannot write");
  msg = error_of([&] { write_safetensors(p, {{"a", Tensor({1}, DType::F32)}, {"a", Tensor({1}, DType::F32)}}); });
  EXPECT_HAS(msg, "listed twice");
}

TEST_F(SafetensorsTest, CorruptedBytesNeverCrash) {
  // Truncations and byte flips of a valid file: each must open cleanly or throw slope::Error
  // (under ASan/UBSan this also shows no read outside the mapping).
  const std::string good = path("good.safetensors");
  write_safetensors(good, {{"a", iota_tensor({4, 4}, DType::BF16)}, {"b", iota_tensor({3}, DType::F32)},
                           {"c", iota_tensor({5}, DType::U8)}}, {{"format", "pt"}});
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t state = 12345;
  auto rnd = [&] { state = state * 6364136223846793005ull + 1442695040888963407ull; return state >> 33; };
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string b = bytes;
    if (iter % 4 == 0) {
      b.resize(rnd() % b.size());
    } else {
      for (int k = 0, n = 1 + int(rnd() % 4); k < n; ++k) b[rnd() % b.size()] = char(rnd());
    }
    const std::string p = write_bytes("bad.safetensors", b);
    try {
      SafetensorsFile f(p);
      for (const auto& n : f.names()) {
        Tensor t = f.get(n);
        volatile uint8_t sink = t.nbytes() ? t.data<uint8_t>()[t.nbytes() - 1] : 0;
        (void)sink;
      }
      ++opened;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
  EXPECT_GT(opened, 0);  // flips inside tensor data are legal
}

// Runs f on a thread and returns the slope::Error it throws; "HUNG" if it has not finished
// within `seconds` (the thread is then left blocked: a hang must fail the test, not stop it).
template <typename F>
std::string error_within(F f, double seconds = 10) {
  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = done->get_future();
  std::thread([f, done] {
    try {
      f();
      done->set_value("");
    } catch (const Error& e) {
      done->set_value(e.what());
    } catch (const std::exception& e) {
      done->set_value(std::string("not a slope::Error: ") + e.what());
    }
  }).detach();
  if (result.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) return "HUNG";
  return result.get();
}

// Regression (issue 15, defect 2): a FIFO in place of a weights file or the index made the
// open wait for a writer forever. It must be refused at once, saying why.
TEST_F(SafetensorsTest, FifoInsteadOfAFileIsRefused) {
  ASSERT_EQ(::mkfifo(path("model.safetensors").c_str(), 0644), 0);
  std::string msg = error_within([this] { WeightStore ws(dir_.string()); });
  EXPECT_HAS(msg, "is a FIFO (named pipe); only regular files are accepted");
  msg = error_within([this] { SafetensorsFile f(path("model.safetensors")); });
  EXPECT_HAS(msg, "is a FIFO");
  ASSERT_EQ(::mkfifo(path("model.safetensors.index.json").c_str(), 0644), 0);
  msg = error_within([this] { WeightStore ws(dir_.string()); });
  EXPECT_HAS(msg, "safetensors index");
  EXPECT_HAS(msg, "is a FIFO");
  fs::create_directories(path("dir.safetensors"));
  msg = error_within([this] { SafetensorsFile f(path("dir.safetensors")); });
  EXPECT_HAS(msg, "is a directory");
}

// Regression (issue 15, defect 5): the writer replaced whatever was at the path (a device node
// became a regular file). It must refuse anything that is not a regular file and leave it.
TEST_F(SafetensorsTest, WriterRefusesDevicesFifosAndDirectories) {
  const std::vector<std::pair<std::string, Tensor>> t = {{"a", iota_tensor({2}, DType::F32)}};
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  std::string msg = error_within([&] { write_safetensors(path("fifo"), t); });
  EXPECT_HAS(msg, "is a FIFO (named pipe); only a regular file or a new path is written");
  EXPECT_TRUE(fs::is_fifo(path("fifo")));
  fs::create_directories(path("d"));
  msg = error_within([&] { write_safetensors(path("d"), t); });
  EXPECT_HAS(msg, "is a directory");
  EXPECT_TRUE(fs::is_directory(path("d")));
  // A character device of our own (root only); /dev/null itself is never put at risk.
  if (::mknod(path("null").c_str(), S_IFCHR | 0644, makedev(1, 3)) == 0) {
    msg = error_within([&] { write_safetensors(path("null"), t); });
    EXPECT_HAS(msg, "is a character device");
    EXPECT_TRUE(fs::is_character_file(path("null")));
  }
  // A regular file is replaced, and no temporary file is left.
  write_bytes("old.safetensors", "old");
  write_safetensors(path("old.safetensors"), t);
  EXPECT_EQ(SafetensorsFile(path("old.safetensors")).get("a").numel(), 2);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) entries += e.path().filename().string().find(".tmp") != std::string::npos;
  EXPECT_EQ(entries, 0);
}

// ---------------------------------------------------------------------------------------------
// WeightStore

TEST_F(SafetensorsTest, WeightStoreSingleFile) {
  write_safetensors(path("model.safetensors"), {{"a.weight", iota_tensor({2, 3}, DType::BF16)},
                                                {"b.bias", iota_tensor({3}, DType::F32)}});
  WeightStore ws(dir_.string());
  EXPECT_EQ(ws.names(), (std::vector<std::string>{"a.weight", "b.bias"}));
  EXPECT_TRUE(ws.contains("a.weight"));
  EXPECT_EQ(ws.get("a.weight", {2, 3}).dtype(), DType::BF16);

  std::string msg = error_of([&] { ws.get("c.weight"); });
  EXPECT_HAS(msg, "missing tensor c.weight in " + dir_.string());
  msg = error_of([&] { ws.get("a.weight", {3, 2}); });
  EXPECT_HAS(msg, "tensor a.weight has shape [2, 3], expected [3, 2]");

  // A file path works too.
  WeightStore one(path("model.safetensors"));
  EXPECT_TRUE(one.contains("b.bias"));
}

TEST_F(SafetensorsTest, WeightStoreSharded) {
  write_safetensors(path("model-00001-of-00002.safetensors"), {{"a", iota_tensor({4}, DType::F32)},
                                                               {"b", iota_tensor({2}, DType::F32)}});
  write_safetensors(path("model-00002-of-00002.safetensors"), {{"c", iota_tensor({8}, DType::U8)}});
  std::ofstream(path("model.safetensors.index.json")) << R"({"metadata": {"total_size": 32}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})";
  WeightStore ws(dir_.string());
  EXPECT_EQ(ws.names().size(), 3u);
  EXPECT_EQ(ws.get("c", {8}).dtype(), DType::U8);
  Tensor a = ws.get("a");
  Tensor expect = iota_tensor({4}, DType::F32);
  EXPECT_EQ(std::memcmp(a.raw(), expect.raw(), 16), 0);
}

TEST_F(SafetensorsTest, WeightStoreShardMissing) {
  write_safetensors(path("model-00001-of-00002.safetensors"), {{"a", iota_tensor({4}, DType::F32)}});
  std::ofstream(path("model.safetensors.index.json")) << R"({"weight_map": {
      "a": "model-00001-of-00002.safetensors", "z": "model-00002-of-00002.safetensors"}})";
  std::string msg = error_of([&] { WeightStore ws(dir_.string()); });
  EXPECT_HAS(msg, "model-00002-of-00002.safetensors");
  EXPECT_HAS(msg, "missing");
  EXPECT_HAS(msg, "'z'");
}

TEST_F(SafetensorsTest, WeightStoreIndexErrors) {
  write_safetensors(path("model-00001-of-00001.safetensors"), {{"a", iota_tensor({4}, DType::F32)}});
  std::ofstream(path("model.safetensors.index.json")) << R"({"weight_map": {"q": "model-00001-of-00001.safetensors"}})";
  std::string msg = error_of([&] { WeightStore ws(dir_.string()); });
  EXPECT_HAS(msg, "lists tensor 'q'");
  std::ofstream(path("model.safetensors.index.json")) << R"({"metadata": {}})";
  msg = error_of([&] { WeightStore ws(dir_.string()); });
  EXPECT_HAS(msg, "weight_map");
  std::ofstream(path("model.safetensors.index.json")) << R"({"weight_map": )";
  msg = error_of([&] { WeightStore ws(dir_.string()); });
  EXPECT_HAS(msg, "not a valid JSON");
}

TEST_F(SafetensorsTest, WeightStoreMissingDirOrFiles) {
  std::string msg = error_of([&] { WeightStore ws(path("nowhere")); });
  EXPECT_HAS(msg, "nowhere");
  EXPECT_HAS(msg, "does not exist");
  msg = error_of([&] { WeightStore ws(dir_.string()); });
  EXPECT_HAS(msg, "no model.safetensors");
  // A corrupt model.safetensors surfaces the file-level error.
  write_bytes("model.safetensors", "abc");
  msg = error_of([&] { WeightStore ws(dir_.string()); });
  EXPECT_HAS(msg, "model.safetensors");
  EXPECT_HAS(msg, "shorter than");
}

}  // namespace
