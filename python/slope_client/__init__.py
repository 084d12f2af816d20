"""Client side of SLOPE's KV hand-off: the KV cache a SLOPE prefill computed, in the layout a
decode engine needs (see docs/kv-format.md)."""

from .cache import KvCache, LayerKv, load_kv_dir

__all__ = ["KvCache", "LayerKv", "load_kv_dir"]
