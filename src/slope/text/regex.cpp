#define PCRE2_CODE_UNIT_WIDTH 8
#include "slope/text/regex.h"

#include <pcre2.h>

#include "slope/core/error.h"
#include "slope/text/unicode_proxy.h"

namespace slope::text {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: match data sized for any pattern (we read only the whole-match range)
// and a JIT stack large enough for long runs of one character class (the default 32 KiB is not).
struct ThreadState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  ThreadState() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~ThreadState() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadState& thread_state() {
  thread_local ThreadState s;
  return s;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;  // compiled to machine code: matched with pcre2_jit_match, which skips the option checks
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern) : impl_(std::make_shared<Impl>()), pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  SLOPE_CHECK(impl_->code, "regex '", pattern, "' does not compile at offset ", off, ": ", pcre2_message(err),
              "; fix the pattern in tokenizer.json");
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;  // else the interpreter runs it
}

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  ThreadState& ts = thread_state();
  // Characters newer than PCRE2's Unicode tables are matched as stand-ins of their class.
  thread_local std::string proxy;
  if (unicode_proxy_text(subject, proxy)) subject = proxy;
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  const auto next_char = [&](size_t i) {
    size_t j = i + 1;
    while (j < subject.size() && (static_cast<unsigned char>(subject[j]) & 0xC0) == 0x80) ++j;
    return j;
  };
  while (pos <= subject.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, s, subject.size(), pos, 0, ts.data, ts.ctx)
                              : pcre2_match(impl_->code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, ts.data, ts.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    SLOPE_CHECK(rc >= 0, "regex '", pattern_, "' failed on a ", subject.size(), "-byte piece: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.data);
    out.emplace_back(ov[0], ov[1]);
    if (ov[1] > ov[0]) {
      pos = ov[1];
    } else {  // an empty match: resume one character on so the loop always advances
      if (ov[1] >= subject.size()) return;
      pos = next_char(ov[1]);
    }
  }
}

}  // namespace slope::text
