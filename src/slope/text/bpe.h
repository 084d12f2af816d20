// The BPE model of tokenizer.json: vocab, merges (as "a b" strings or [a, b] pairs),
// ignore_merges, byte_fallback, unk_token and fuse_unk. A word starts as one symbol per
// character and merges the adjacent pair of lowest rank until none is left; a hash map over
// pair ids gives each pair's rank, a heap orders the candidates, and symbols form a linked list,
// so a word of n characters costs O(n log n). Words seen before come from a cache.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "slope/text/json_fields.h"

namespace slope::text {

class Bpe {
 public:
  // `model` is tokenizer.json's "model" object; throws slope::Error naming what is wrong.
  explicit Bpe(const json& model);

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // -1 when the token is not in the vocab.
  int32_t token_to_id(std::string_view token) const;
  // nullptr when no token has this id.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(tokens_.size()) - 1; }

 private:
  struct MergeTarget {
    uint32_t rank;
    int32_t id;
  };
  // Open-addressing map from a pair of ids (packed in 64 bits) to its merge.
  class PairMap {
   public:
    void build(const std::vector<std::pair<uint64_t, MergeTarget>>& entries);
    const MergeTarget* find(uint64_t key) const {
      for (size_t h = hash(key);; h = (h + 1) & mask_) {
        if (keys_[h] == key) return &values_[h];
        if (keys_[h] == kEmpty) return nullptr;
      }
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t(0);
    size_t hash(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_); }
    std::vector<uint64_t> keys_;
    std::vector<MergeTarget> values_;
    size_t mask_ = 0;
    int shift_ = 64;
  };

  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  int32_t char_id(std::string_view ch, char32_t cp) const;

  std::vector<std::string> tokens_;  // by id; empty where no token has the id
  std::vector<bool> present_;
  std::unordered_map<std::string_view, int32_t> vocab_;  // views into tokens_
  std::vector<int32_t> small_char_id_;                   // single characters below U+0800
  PairMap merges_;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256];  // <0xXX> tokens for byte fallback, -1 where absent

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace slope::text
