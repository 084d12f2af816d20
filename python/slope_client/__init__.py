"""Client side of SLOPE's KV hand-off: the KV cache a SLOPE prefill computed, in the layout a
decode engine needs (see docs/kv-format.md), pulled from every rank at once or read from files."""

from .cache import KvCache, LayerKv, load_kv_dir
from .transfer import KvTransferError, PushReceiver, pull, receive_push

__all__ = ["KvCache", "LayerKv", "load_kv_dir", "pull", "receive_push", "PushReceiver", "KvTransferError"]
