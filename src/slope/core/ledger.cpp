#include "slope/core/ledger.h"

namespace slope {

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::Embed: return "embed";
    case Phase::NormQkvRope: return "norm_qkv_rope";
    case Phase::Attention: return "attention";
    case Phase::OProj: return "o_proj";
    case Phase::Mlp: return "mlp";
    case Phase::LmHead: return "lm_head";
    case Phase::TpAllreduce: return "tp_allreduce";
    case Phase::AttnCompute: return "attention_compute";
    case Phase::AttnComm: return "attention_comm";
    case Phase::AttnWait: return "attention_wait";
    case Phase::PipeRecvWait: return "pipeline_recv_wait";
    case Phase::PipeSendWait: return "pipeline_send_wait";
    case Phase::Count: break;
  }
  return "?";
}

}  // namespace slope
