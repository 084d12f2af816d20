"""The in-memory KV cache of one prefilled prompt, assembled from every rank's shard.

`KvCache` is what every decode-side adapter (transformers, llama.cpp, vLLM) takes. It is filled
either from the shard files of `slope run --kv-out DIR` (`load_kv_dir`) or pulled from the
ranks of a running prefill over the transfer protocol.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LayerKv:
    """One layer's keys and values for consecutive global positions.

    k, v: float32 arrays [rows, num_kv_heads, head_dim]; K after RoPE, exactly what Hugging Face
    transformers keeps in its cache (transposed from [heads, tokens, head_dim]). Row i holds the
    position first_position + i. A full-attention layer holds every position (first_position 0);
    a sliding-window layer (window W > 0) may hold only the last W.
    """

    k: np.ndarray
    v: np.ndarray
    first_position: int = 0
    window: int = 0

    @property
    def rows(self) -> int:
        return int(self.k.shape[0])


@dataclass
class KvCache:
    """The KV cache of one prompt: every layer, every KV head, in global position order."""

    num_tokens: int
    num_kv_heads: int
    head_dim: int
    architecture: str
    layers: list[LayerKv]
    first_token: int | None = None  # the prefill's first generated token, when known
    meta: dict = field(default_factory=dict)  # the shards' metadata (identity keys etc.)

    def check(self) -> None:
        """Raises ValueError unless every layer is consistent with the cache's shape."""
        for i, layer in enumerate(self.layers):
            want = (layer.rows, self.num_kv_heads, self.head_dim)
            if layer.k.shape != want or layer.v.shape != want:
                raise ValueError(f"layer {i}: K {layer.k.shape} / V {layer.v.shape}, want {want}")
            if layer.first_position + layer.rows != self.num_tokens:
                raise ValueError(f"layer {i}: rows {layer.first_position}..{layer.first_position + layer.rows}"
                                 f" do not end at the prompt's last position {self.num_tokens - 1}")
            if layer.window == 0 and layer.first_position != 0:
                raise ValueError(f"layer {i}: a full-attention layer must hold every position")


_DTYPES = {"F32": np.float32, "BF16": np.uint16, "I64": np.int64}


def read_safetensors(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor of a safetensors file (BF16 widened to float32) and its metadata."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(raw)[8 + n:]
    tensors = {}
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {dtype}; a KV shard holds F32, BF16 or I64")
        begin, end = info["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype=_DTYPES[dtype]).reshape(info["shape"])
        if dtype == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = a
    return tensors, meta


_IDENTITY = ("prefill_id", "model_hash", "tokens_hash", "compute_dtype", "kv_dtype", "architecture",
             "total_tokens", "num_layers", "num_kv_heads", "head_dim", "world_size")


def load_kv_dir(path: str) -> KvCache:
    """Assembles the KV cache from `slope run --kv-out DIR`'s shard files (or one merged file).

    Every shard must belong to the same prefill; each (layer, position, head) must be held by
    exactly one shard. Sliding-window layers are returned with every position, as stored.
    """
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if re.fullmatch(r"kv\.rank\d+-of-\d+\.safetensors", n))
        files = [os.path.join(path, n) for n in names]
        if not files:
            raise ValueError(f"{path}: no kv.rank<r>-of-<n>.safetensors files (written by slope run --kv-out)")
    else:
        files = [path]

    first_meta = None
    layers_k: dict[int, np.ndarray] = {}
    layers_v: dict[int, np.ndarray] = {}
    filled: dict[int, np.ndarray] = {}
    windows: dict[int, int] = {}
    for f in files:
        tensors, meta = read_safetensors(f)
        if meta.get("format") != "slope-kv" or meta.get("format_version") != "2":
            raise ValueError(f"{f}: not a slope-kv version 2 file")
        if first_meta is None:
            first_meta = meta
            n = int(meta["total_tokens"])
            hkv, d = int(meta["num_kv_heads"]), int(meta["head_dim"])
        else:
            diff = [k for k in _IDENTITY if meta.get(k) != first_meta.get(k)]
            if diff:
                raise ValueError(f"{f} and {files[0]} are of different prefills (they differ in {', '.join(diff)})")
        pos = tensors["positions"].astype(np.int64)
        h0 = int(meta["kv_head0"])
        first, count = int(meta["first_layer"]), int(meta["layer_count"])
        for j, w in enumerate(w for w in meta["layer_windows"].split(",") if w != ""):
            windows[first + j] = int(w)
        for i in range(first, first + count):
            k, v = tensors[f"layers.{i}.k"], tensors[f"layers.{i}.v"]
            heads = k.shape[1]
            if i not in layers_k:
                layers_k[i] = np.zeros((n, hkv, d), np.float32)
                layers_v[i] = np.zeros((n, hkv, d), np.float32)
                filled[i] = np.zeros((n, hkv), np.int32)
            layers_k[i][pos, h0:h0 + heads] = k
            layers_v[i][pos, h0:h0 + heads] = v
            np.add.at(filled[i], (pos[:, None], np.arange(h0, h0 + heads)[None, :]), 1)

    num_layers = int(first_meta["num_layers"])
    layers = []
    for i in range(num_layers):
        if i not in layers_k:
            raise ValueError(f"{path}: no shard holds layer {i}")
        bad = np.argwhere(filled[i] != 1)
        if bad.size:
            p, h = bad[0]
            what = "no shard" if filled[i][p, h] == 0 else "two shards"
            raise ValueError(f"{path}: layer {i}, position {p}, KV head {h} is held by {what}")
        layers.append(LayerKv(layers_k[i], layers_v[i], 0, windows.get(i, 0)))
    cache = KvCache(n, hkv, d, first_meta["architecture"], layers, meta=dict(first_meta))
    cache.check()
    return cache
