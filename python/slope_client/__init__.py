"""Client side of SLOPE's KV hand-off: the KV cache a SLOPE prefill computed, in the layout a
decode engine needs (see docs/kv-format.md), pulled from every rank at once or read from files."""

from .cache import KvCache, LayerKv, load_kv_dir
from .transfer import KvTransferError, PushReceiver, pull, receive_push
from .hf import Continuation, generate_from_kv, to_dynamic_cache  # torch is imported on use

# slope_client.llamacpp and slope_client.vllm_connector are imported by name only: they need
# llama_cpp / vLLM (vLLM loads the connector by its module path).

__all__ = ["KvCache", "LayerKv", "load_kv_dir", "pull", "receive_push", "PushReceiver", "KvTransferError",
           "to_dynamic_cache", "generate_from_kv", "Continuation"]
