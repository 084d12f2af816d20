// One rank's time and traffic by phase: the single place where the engine's per-phase seconds
// and bytes are collected, instead of clock pairs placed by hand around each phase.
//
//   Ledger ledger;
//   {
//     auto t = ledger.time(Phase::Mlp);  // adds the scope's wall seconds to Mlp
//     ...
//   }
//   ledger.add(Phase::AttnComm, completed - posted);  // a span that is not a scope
//   ledger.count_sent(bytes);
//
// The layer (model/), context-parallel attention (parallel/) and the pipeline (engine/) each
// write their phases into the ledger they are handed; the engine sums them into RankReport.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "slope/core/sys.h"

namespace slope {

enum class Phase : uint8_t {
  // The decoder layer and the ends of the model (model/).
  Embed,
  NormQkvRope,
  Attention,  // the whole attention call: kernels, and under context parallelism its traffic
  OProj,
  Mlp,
  LmHead,
  TpAllreduce,
  // Inside context-parallel attention (parallel/).
  AttnCompute,  // kernels, merges, sinks, packing
  AttnComm,     // transfer lifetimes, posted to seen complete (overlapped or not)
  AttnWait,     // blocked waiting for communication (the exposed part)
  // Pipeline stages (engine/).
  PipeRecvWait,  // waiting for the previous stage's activations
  PipeSendWait,  // waiting for sends to drain at the end
  Count
};

std::string_view phase_name(Phase p);  // "embed", "norm_qkv_rope", ...

class Ledger {
 public:
  // Adds the wall seconds between its construction and its end (destruction or stop()).
  class Scope {
   public:
    Scope(Ledger* ledger, Phase phase) : ledger_(ledger), phase_(phase), t0_(now_seconds()) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() { stop(); }
    void stop() {
      if (ledger_) ledger_->add(phase_, now_seconds() - t0_);
      ledger_ = nullptr;
    }

   private:
    Ledger* ledger_;
    Phase phase_;
    double t0_;
  };

  [[nodiscard]] Scope time(Phase p) { return Scope(this, p); }
  void add(Phase p, double seconds) { seconds_[size_t(p)] += seconds; }
  double seconds(Phase p) const { return seconds_[size_t(p)]; }
  // Sum of several phases.
  template <typename... P>
  double sum(P... phases) const {
    return (seconds(phases) + ...);
  }

  void count_sent(int64_t bytes) { bytes_sent_ += bytes; }
  void count_received(int64_t bytes) { bytes_received_ += bytes; }
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

  Ledger& operator+=(const Ledger& o) {
    for (size_t i = 0; i < seconds_.size(); ++i) seconds_[i] += o.seconds_[i];
    bytes_sent_ += o.bytes_sent_;
    bytes_received_ += o.bytes_received_;
    return *this;
  }
  void reset() { *this = Ledger(); }

 private:
  std::array<double, size_t(Phase::Count)> seconds_{};
  int64_t bytes_sent_ = 0, bytes_received_ = 0;
};

}  // namespace slope
