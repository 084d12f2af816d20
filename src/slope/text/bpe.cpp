#include "slope/text/bpe.h"

#include <bit>
#include <cstdio>
#include <queue>

#include "slope/text/utf8.h"

namespace slope::text {
namespace {

constexpr size_t kCacheMaxWordBytes = 256;
constexpr size_t kCacheMaxEntries = 1 << 18;

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace

void Bpe::PairMap::build(const std::vector<std::pair<uint64_t, MergeTarget>>& entries) {
  size_t cap = 16;
  while (cap < entries.size() * 2) cap *= 2;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, MergeTarget{0, 0});
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  for (const auto& [key, target] : entries) {
    size_t h = hash(key);
    while (keys_[h] != kEmpty && keys_[h] != key) h = (h + 1) & mask_;
    keys_[h] = key;  // a pair listed twice keeps its later rank, as `tokenizers` does
    values_[h] = target;
  }
}

Bpe::Bpe(const json& model) {
  const std::string where = "model BPE";
  for (const char* unsupported : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const std::string v = get_or<std::string>(model, unsupported, "", where);
    SLOPE_CHECK(v.empty(), "tokenizer.json: ", where, " option '", unsupported, "' = '", v,
                "' is not supported (byte-level and SentencePiece-style BPE do not use it)");
  }
  const double dropout = get_or<double>(model, "dropout", 0.0, where);
  SLOPE_CHECK(dropout == 0.0, "tokenizer.json: ", where, " dropout ", dropout,
              " is not supported: dropout makes encoding random; set it to null");
  ignore_merges_ = get_or<bool>(model, "ignore_merges", false, where);
  byte_fallback_ = get_or<bool>(model, "byte_fallback", false, where);
  fuse_unk_ = get_or<bool>(model, "fuse_unk", false, where);

  const json& vocab = required(model, "vocab", where);
  SLOPE_CHECK(vocab.is_object(), "tokenizer.json: ", where, " 'vocab' must map tokens to ids");
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    SLOPE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t(1) << 31),
                "tokenizer.json: ", where, " vocab id of '", tok, "' is not a non-negative integer");
    max_id = std::max(max_id, id.get<int64_t>());
  }
  tokens_.assign(size_t(max_id + 1), std::string());
  present_.assign(size_t(max_id + 1), false);
  for (const auto& [tok, id] : vocab.items()) {
    const auto i = size_t(id.get<int64_t>());
    tokens_[i] = tok;
    present_[i] = true;
  }
  vocab_.reserve(tokens_.size() * 2);
  small_char_id_.assign(0x800, -1);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (!present_[i]) continue;
    vocab_[tokens_[i]] = int32_t(i);
    const std::string& t = tokens_[i];
    if (utf8_invalid_offset(t) != std::string::npos) continue;
    size_t k = 0;
    const char32_t cp = t.empty() ? 0 : utf8_next(t, k);
    if (!t.empty() && k == t.size() && cp < 0x800) small_char_id_[cp] = int32_t(i);
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_ids_[b] = token_to_id(name);
  }
  const std::string unk = get_or<std::string>(model, "unk_token", "", where);
  if (!unk.empty()) {
    unk_id_ = token_to_id(unk);
    SLOPE_CHECK(unk_id_ >= 0, "tokenizer.json: ", where, " unk_token '", unk, "' is not in the vocab");
  }

  const json& merges = required(model, "merges", where);
  SLOPE_CHECK(merges.is_array(), "tokenizer.json: ", where, " 'merges' must be a list");
  std::vector<std::pair<uint64_t, MergeTarget>> entries;
  entries.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      SLOPE_CHECK(sp != std::string::npos, "tokenizer.json: ", where, " merge ", r, " '", s,
                  "' is not two tokens separated by a space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      fail("tokenizer.json: ", where, " merge ", r, " is ", m.dump(), "; expected \"a b\" or [\"a\", \"b\"]");
    }
    const int32_t ia = token_to_id(a), ib = token_to_id(b), inew = token_to_id(a + b);
    SLOPE_CHECK(ia >= 0 && ib >= 0 && inew >= 0, "tokenizer.json: ", where, " merge ", r, " ('", a, "', '", b,
                "') uses a token that is not in the vocab ('", ia < 0 ? a : ib < 0 ? b : a + b, "')");
    entries.push_back({pair_key(ia, ib), MergeTarget{uint32_t(r), inew}});
  }
  merges_.build(entries);
}

int32_t Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= tokens_.size() || !present_[size_t(id)]) return nullptr;
  return &tokens_[size_t(id)];
}

int32_t Bpe::char_id(std::string_view ch, char32_t cp) const {
  if (cp < 0x800) return small_char_id_[cp];
  return token_to_id(ch);
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t id = token_to_id(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() > kCacheMaxWordBytes) {
    merge_word(word, out);
    return;
  }
  std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kCacheMaxEntries) cache_.clear();
  cache_.emplace(std::move(key), std::vector<int32_t>(out.begin() + long(first), out.end()));
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  const auto add = [&](int32_t id) {
    const int32_t n = int32_t(sym.size());
    sym.push_back({id, n - 1, n + 1, true});
  };
  // One symbol per character; characters outside the vocab become their <0xXX> bytes, or unk
  // (fused over a run when fuse_unk), or are dropped when there is neither, as in `tokenizers`.
  int32_t pending_unk = -1;
  size_t i = 0;
  while (i < word.size()) {
    const size_t b = i;
    const char32_t cp = utf8_next(word, i);
    const int32_t id = char_id(word.substr(b, i - b), cp);
    if (id >= 0) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = b; k < i; ++k) all &= byte_ids_[static_cast<unsigned char>(word[k])] >= 0;
      if (all) {
        for (size_t k = b; k < i; ++k) add(byte_ids_[static_cast<unsigned char>(word[k])]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (const MergeTarget* m = merges_.find(pair_key(sym[k].id, sym[k + 1].id)))
      heap.push({m->rank, int32_t(k), m->id});
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    Symbol& left = sym[size_t(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[size_t(left.next)];
    // Stale candidates: the pair at this position changed since it was queued.
    const MergeTarget* m = merges_.find(pair_key(left.id, right.id));
    if (!m || m->id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0)
      if (const MergeTarget* pm = merges_.find(pair_key(sym[size_t(left.prev)].id, left.id)))
        heap.push({pm->rank, left.prev, pm->id});
    if (left.next >= 0)
      if (const MergeTarget* nm = merges_.find(pair_key(left.id, sym[size_t(left.next)].id)))
        heap.push({nm->rank, top.pos, nm->id});
  }
  for (int32_t k = 0; k >= 0; k = sym[size_t(k)].next) out.push_back(sym[size_t(k)].id);
}

}  // namespace slope::text
