"""llama.cpp continues from SLOPE's KV: its sequence state, written from a KvCache.

llama.cpp saves and restores one sequence's KV cache with `llama_state_seq_get_data` /
`llama_state_seq_set_data` (a buffer) and `llama_state_seq_save_file` / `_load_file` (a 'ggsq'
file). This module writes both from a `KvCache`, so that a llama.cpp context on the GGUF that
llama.cpp's own converter made from the same HF checkpoint decodes on as if it had prefilled the
prompt itself. See docs/kv-llamacpp.md.

The format is pinned to the llama.cpp that llama-cpp-python 0.3.36 vendors (ggml-org/llama.cpp
0c1e57098, LLAMA_STATE_SEQ_VERSION 3); `restore` refuses another llama-cpp-python. Layout, read
from that source (src/llama-context.cpp, src/llama-kv-cache.cpp state_write*,
src/llama-kv-cache-iswa.cpp), all little endian:

    file      := u32 'ggsq' (0x67677371) | u32 version 3 | u32 n_tokens | i32 tokens[n_tokens] | body
    set_data  := u32 0xaf143cd8 | i32 seq_id | body
    body      := section                       (one KV cache: every layer)
               | section(full) section(swa)    (interleaved SWA cache, e.g. gpt-oss: base first)
    section   := u32 n_stream, then per stream: u32 cell_count, and when cell_count > 0:
                 cells[cell_count] := i32 pos | u32 n_seq_id (1) | i32 seq_id
                 u32 v_trans | u32 n_layer
                 per layer:  i32 k_type | u64 k_row_bytes | K rows [cell_count, n_head_kv*head_dim]
                 v_trans 0, per layer: i32 v_type | u64 v_row_bytes | V rows [cell_count, n_embd_v]
                 v_trans 1, per layer: i32 v_type | u32 v_elem_bytes | u32 n_embd_v
                                       | V^T [n_embd_v, cell_count]

A section's layers are the model's layers that cache holds, in order: every layer for a plain
cache; the non-SWA ones then the SWA ones for an interleaved cache. An SWA section holds only
the cells llama.cpp keeps unmasked: positions p with p_max - p < n_swa (the last n_swa).
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

import numpy as np

from .cache import KvCache

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the pinned sdist; it vendors llama.cpp 0c1e57098
LLAMA_CPP_COMMIT = "0c1e57098"
STATE_SEQ_MAGIC = 0x67677371  # 'ggsq', LLAMA_STATE_SEQ_MAGIC
STATE_SEQ_VERSION = 3  # LLAMA_STATE_SEQ_VERSION
IO_MAGIC = 0xAF143CD8  # llama_context::state_seq_get_data's buffer prefix

# ggml_type ids (ggml.h) of the cache types this writer can produce.
GGML_TYPES = {"f32": 0, "f16": 1, "bf16": 30}
_TYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2}

# Per GGUF architecture (general.architecture): llama.cpp's RoPE type (llama_model_rope_type)
# and the SWA pattern its loader assumes when the GGUF has no sliding_window_pattern key
# (load_swa_pattern(ml, n) in src/models/<arch>.cpp; 0 = no SWA). Only architectures whose
# cache has no per-cell extension (no M-RoPE, no per-layer embeddings) are listed: for them a
# cell is just (pos, seq_id).
#   norm: rotates adjacent pairs (2i, 2i+1). convert_hf_to_gguf.py permutes Llama's q/k
#         projections so that this equals HF's rotate_half on (i, i + d/2); the cached K is then
#         HF's K with each head's dimensions reordered the same way.
#   neox: rotates (i, i + d/2), HF's own order: K is cached as HF holds it.
_ARCHS = {
    "llama": ("norm", 0),
    "gpt-oss": ("neox", 2),
    "qwen2": ("neox", 0),
    "qwen3": ("neox", 0),
}


@dataclass
class GgufLayout:
    """What llama.cpp's KV cache looks like for one GGUF (read by `read_gguf_layout`)."""

    architecture: str  # general.architecture, e.g. "llama", "gpt-oss"
    n_layer: int
    n_head_kv: int
    key_length: int  # head dim of K
    value_length: int  # head dim of V
    swa_layers: list[bool]  # per layer: True when it is a sliding-window layer
    n_swa: int  # the window (0 without SWA layers)
    rope: str  # "norm" or "neox"

    @property
    def interleaved(self) -> bool:
        """True when llama.cpp makes two caches (llama_kv_cache_iswa): full layers and SWA layers."""
        return any(self.swa_layers)


def read_gguf_layout(path: str) -> GgufLayout:
    """Reads the KV cache layout from a GGUF's metadata (needs the vendored gguf-py, `gguf`)."""
    try:
        import gguf
    except ImportError as e:
        raise RuntimeError("reading a GGUF needs llama.cpp's gguf-py: install it "
                           "(scripts/llamacpp-venv.sh does) or pass a GgufLayout") from e
    reader = gguf.GGUFReader(path)

    def get(key, default=None):
        field = reader.get_field(key)
        if field is None:
            if default is None:
                raise ValueError(f"{path}: GGUF has no {key}; is it a model made by convert_hf_to_gguf.py?")
            return default
        return field.contents()

    arch = get("general.architecture")
    if arch not in _ARCHS:
        raise ValueError(f"{path}: architecture {arch!r} is not supported by the llama.cpp state writer "
                         f"(supported: {', '.join(sorted(_ARCHS))})")
    rope, default_pattern = _ARCHS[arch]
    n_layer = int(get(f"{arch}.block_count"))
    n_head = get(f"{arch}.attention.head_count")
    n_head_kv = get(f"{arch}.attention.head_count_kv", n_head)
    for name, value in (("head_count", n_head), ("head_count_kv", n_head_kv)):
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise ValueError(f"{path}: per-layer {arch}.attention.{name} {value} is not supported")
    n_head = int(n_head[0] if isinstance(n_head, list) else n_head)
    n_head_kv = int(n_head_kv[0] if isinstance(n_head_kv, list) else n_head_kv)
    n_embd = int(get(f"{arch}.embedding_length"))
    key_length = int(get(f"{arch}.attention.key_length", n_embd // n_head))
    value_length = int(get(f"{arch}.attention.value_length", n_embd // n_head))

    # The SWA layers, as load_swa_pattern decides them: an explicit per-layer array, else a
    # period n (layer il is SWA when il % n < n - 1), from the GGUF or the architecture's default.
    n_swa = int(get(f"{arch}.attention.sliding_window", 0)) if default_pattern else 0
    pattern = reader.get_field(f"{arch}.attention.sliding_window_pattern")
    if pattern is not None and len(pattern.data) > 1:
        swa = [bool(x) for x in pattern.contents()]
    else:
        n = int(pattern.contents()) if pattern is not None else default_pattern
        swa = [n_swa > 0 and (n == 0 or il % n < n - 1) for il in range(n_layer)]
    if len(swa) != n_layer:
        raise ValueError(f"{path}: sliding_window_pattern has {len(swa)} entries for {n_layer} layers")
    if any(swa) and n_swa <= 0:
        raise ValueError(f"{path}: SWA layers but no {arch}.attention.sliding_window")
    return GgufLayout(arch, n_layer, n_head_kv, key_length, value_length, swa, n_swa if any(swa) else 0, rope)


def norm_rope_permutation(head_dim: int) -> np.ndarray:
    """Index map from HF's head dimensions to llama.cpp's for NORM RoPE: out[..., j] = hf[..., perm[j]].

    convert_hf_to_gguf.py's LlamaModel.permute reshapes each head's rows as (2, d/2) and swaps
    the axes, so GGUF row 2i + c is HF row c*d/2 + i; K = x W_k^T inherits the same order, and
    RoPE commutes with it because NORM rotates (2i, 2i+1) by the angle HF uses for (i, i + d/2).
    """
    if head_dim % 2:
        raise ValueError(f"head_dim {head_dim} is odd; RoPE needs pairs")
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)


def _encode(a: np.ndarray, ggml_type: str) -> bytes:
    """float32 array -> the cache type's little-endian bytes."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if ggml_type == "f32":
        return a.astype("<f4").tobytes()
    if ggml_type == "f16":
        return a.astype("<f2").tobytes()
    # bf16, round to nearest even (what ggml_fp32_to_bf16 does for finite values)
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def _section(cache: KvCache, layout: GgufLayout, layer_ids: list[int], first_pos: int, *, v_trans: bool,
             type_k: str, type_v: str, seq_id: int, n_stream: int, stream: int) -> bytes:
    """One llama_kv_cache's state_write for one sequence: positions first_pos .. num_tokens-1."""
    n = cache.num_tokens
    cells = n - first_pos
    out = [struct.pack("<I", n_stream)]
    for s in range(n_stream):
        if s != stream:
            out.append(struct.pack("<I", 0))
            continue
        out.append(struct.pack("<I", cells))
        if cells == 0:
            continue
        meta = np.zeros(cells, dtype=[("pos", "<i4"), ("n_seq_id", "<u4"), ("seq_id", "<i4")])
        meta["pos"] = np.arange(first_pos, n)
        meta["n_seq_id"] = 1
        meta["seq_id"] = seq_id
        out.append(meta.tobytes())
        out.append(struct.pack("<II", int(v_trans), len(layer_ids)))
        perm = norm_rope_permutation(layout.key_length) if layout.rope == "norm" else None
        n_embd_k = layout.n_head_kv * layout.key_length
        n_embd_v = layout.n_head_kv * layout.value_length
        ks, vs = [], []
        for il in layer_ids:
            layer = cache.layers[il]
            lo = first_pos - layer.first_position
            if lo < 0:
                raise ValueError(f"layer {il} holds positions from {layer.first_position}; llama.cpp's cache "
                                 f"needs them from {first_pos} (pull it with a window of at least "
                                 f"{n - first_pos}, or untrimmed)")
            k = layer.k[lo:]  # [cells, n_head_kv, key_length], HF order
            if perm is not None:
                k = k[:, :, perm]
            ks.append(k.reshape(cells, n_embd_k))
            vs.append(layer.v[lo:].reshape(cells, n_embd_v))
        for k in ks:
            out.append(struct.pack("<iQ", GGML_TYPES[type_k], n_embd_k * _TYPE_BYTES[type_k]))
            out.append(_encode(k, type_k))
        for v in vs:
            if v_trans:  # without flash attention llama.cpp stores V transposed: [n_embd_v, cells]
                out.append(struct.pack("<iII", GGML_TYPES[type_v], _TYPE_BYTES[type_v], n_embd_v))
                out.append(_encode(v.T, type_v))
            else:
                out.append(struct.pack("<iQ", GGML_TYPES[type_v], n_embd_v * _TYPE_BYTES[type_v]))
                out.append(_encode(v, type_v))
    return b"".join(out)


def check_layout(cache: KvCache, layout: GgufLayout) -> None:
    """Raises ValueError unless the cache is of a model with this GGUF's layout."""
    cache.check()
    if len(cache.layers) != layout.n_layer:
        raise ValueError(f"the KV cache has {len(cache.layers)} layers, the GGUF {layout.n_layer}: "
                         "is the GGUF converted from the checkpoint SLOPE prefilled?")
    if cache.num_kv_heads != layout.n_head_kv or cache.head_dim != layout.key_length \
            or cache.head_dim != layout.value_length:
        raise ValueError(f"the KV cache has {cache.num_kv_heads} KV heads of dim {cache.head_dim}, the GGUF "
                         f"{layout.n_head_kv} of K dim {layout.key_length} / V dim {layout.value_length}")
    for il, layer in enumerate(cache.layers):
        want = layout.n_swa if layout.swa_layers[il] else 0
        if layer.window != want:
            raise ValueError(f"layer {il}: SLOPE's window is {layer.window}, llama.cpp's {want} (0 = full "
                             "attention): the GGUF's layer types differ from the checkpoint's")


def seq_state_body(cache: KvCache, layout: GgufLayout, *, flash_attn: bool, type_k: str = "f32",
                   type_v: str = "f32", seq_id: int = 0, n_stream: int = 1, stream: int = 0) -> bytes:
    """The sequence state that llama_state_seq_save_file writes after the tokens (state_seq_write_data).

    flash_attn: whether the llama.cpp context runs with flash attention (V is stored transposed
    when it does not). type_k / type_v: the context's cache types ("f32", "f16" or "bf16").
    n_stream / stream: the context's KV streams (1 unless kv_unified is off with several
    sequences) and the one the sequence lives in.
    """
    for name, t in (("type_k", type_k), ("type_v", type_v)):
        if t not in GGML_TYPES:
            raise ValueError(f"{name} {t!r}: the state writer makes f32, f16 or bf16 caches")
    if not 0 <= stream < n_stream:
        raise ValueError(f"stream {stream} is not one of the context's {n_stream} KV streams")
    check_layout(cache, layout)
    kw = dict(v_trans=not flash_attn, type_k=type_k, type_v=type_v, seq_id=seq_id, n_stream=n_stream,
              stream=stream)
    if not layout.interleaved:
        return _section(cache, layout, list(range(layout.n_layer)), 0, **kw)
    full = [il for il in range(layout.n_layer) if not layout.swa_layers[il]]
    swa = [il for il in range(layout.n_layer) if layout.swa_layers[il]]
    swa_first = max(0, cache.num_tokens - layout.n_swa)  # the unmasked cells: p > p_max - n_swa
    return (_section(cache, layout, full, 0, **kw) + _section(cache, layout, swa, swa_first, **kw))


def seq_state_data(cache: KvCache, layout: GgufLayout, *, seq_id: int = 0, **kw) -> bytes:
    """The buffer that llama_state_seq_set_data takes (what llama_state_seq_get_data returns)."""
    return struct.pack("<Ii", IO_MAGIC, seq_id) + seq_state_body(cache, layout, seq_id=seq_id, **kw)


def write_seq_state_file(path: str, cache: KvCache, tokens, layout: GgufLayout, *,
                         version: int = STATE_SEQ_VERSION, **kw) -> int:
    """Writes a 'ggsq' file for llama_state_seq_load_file; returns its size in bytes.

    tokens: the prompt's token ids (as many as the cache's positions).
    """
    if version != STATE_SEQ_VERSION:
        raise ValueError(f"'ggsq' version {version} requested; this writer knows only version "
                         f"{STATE_SEQ_VERSION} (llama.cpp {LLAMA_CPP_COMMIT}, llama-cpp-python "
                         f"{LLAMA_CPP_PYTHON_VERSION})")
    tokens = np.asarray(tokens, dtype="<i4").reshape(-1)
    if len(tokens) != cache.num_tokens:
        raise ValueError(f"{len(tokens)} tokens for a KV cache of {cache.num_tokens} positions")
    body = seq_state_body(cache, layout, **kw)
    data = struct.pack("<III", STATE_SEQ_MAGIC, STATE_SEQ_VERSION, len(tokens)) + tokens.tobytes() + body
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def _decode(raw: bytes, ggml_type: int, shape) -> np.ndarray:
    names = {v: k for k, v in GGML_TYPES.items()}
    if ggml_type not in names:
        raise ValueError(f"cache type ggml_type {ggml_type}: the state reader knows f32, f16 and bf16")
    t = names[ggml_type]
    if t == "f32":
        a = np.frombuffer(raw, "<f4")
    elif t == "f16":
        a = np.frombuffer(raw, "<f2").astype(np.float32)
    else:
        a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    return a.reshape(shape)


@dataclass
class StateSection:
    """One KV cache's cells as a sequence state holds them (read by `read_seq_state_body`)."""

    positions: np.ndarray  # [cells] int32
    v_trans: bool
    k: list[np.ndarray]  # per layer of the section: [cells, n_embd_k] float32, llama.cpp's order
    v: list[np.ndarray]  # per layer: [cells, n_embd_v] float32 (transposed back when v_trans)
    k_types: list[int]
    v_types: list[int]


def read_seq_state_body(data: bytes, layout: GgufLayout, *, n_stream: int = 1) -> list[StateSection]:
    """Parses a sequence state body (e.g. llama.cpp's own get_data after its 8-byte prefix).

    Returns one section per KV cache (two for an interleaved SWA model: full, then SWA); a
    stream with no cells is skipped. Raises ValueError on a malformed or truncated body.
    """
    mv = memoryview(data)
    off = 0

    def take(fmt_or_n):
        nonlocal off
        if isinstance(fmt_or_n, int):
            if off + fmt_or_n > len(mv):
                raise ValueError(f"sequence state truncated at byte {off} (wants {fmt_or_n} more)")
            b = bytes(mv[off:off + fmt_or_n])
            off += fmt_or_n
            return b
        size = struct.calcsize(fmt_or_n)
        return struct.unpack(fmt_or_n, take(size))

    groups = [list(range(layout.n_layer))]
    if layout.interleaved:
        groups = [[il for il in range(layout.n_layer) if not layout.swa_layers[il]],
                  [il for il in range(layout.n_layer) if layout.swa_layers[il]]]
    sections = []
    for group in groups:
        (streams,) = take("<I")
        if streams != n_stream:
            raise ValueError(f"sequence state has {streams} KV streams, expected {n_stream}")
        for _ in range(streams):
            (cells,) = take("<I")
            if cells == 0:
                continue
            meta = np.frombuffer(take(12 * cells), dtype=[("pos", "<i4"), ("n_seq_id", "<u4"), ("seq_id", "<i4")])
            if np.any(meta["n_seq_id"] != 1):
                raise ValueError("sequence state cells belong to several sequences; expected one each")
            v_trans, n_layer = take("<II")
            if n_layer != len(group):
                raise ValueError(f"sequence state section has {n_layer} layers, the GGUF's cache {len(group)}")
            n_embd_k = layout.n_head_kv * layout.key_length
            n_embd_v = layout.n_head_kv * layout.value_length
            sec = StateSection(meta["pos"].copy(), bool(v_trans), [], [], [], [])
            for _ in group:
                t, row = take("<iQ")
                if row % n_embd_k:
                    raise ValueError(f"K row of {row} bytes for {n_embd_k} values")
                sec.k.append(_decode(take(row * cells), t, (cells, n_embd_k)))
                sec.k_types.append(t)
            for _ in group:
                if v_trans:
                    t, el, n_embd = take("<iII")
                    if n_embd != n_embd_v:
                        raise ValueError(f"transposed V of {n_embd} rows, the GGUF's {n_embd_v}")
                    sec.v.append(_decode(take(el * n_embd * cells), t, (n_embd, cells)).T.copy())
                else:
                    t, row = take("<iQ")
                    sec.v.append(_decode(take(row * cells), t, (cells, n_embd_v)))
                sec.v_types.append(t)
            sections.append(sec)
    if off != len(mv):
        raise ValueError(f"sequence state has {len(mv) - off} bytes after its last section")
    return sections


def _check_llama_cpp(llama_cpp) -> None:
    version = getattr(llama_cpp, "__version__", None)
    if version != LLAMA_CPP_PYTHON_VERSION:
        raise RuntimeError(f"llama-cpp-python {version} is installed; the state writer is pinned to "
                           f"{LLAMA_CPP_PYTHON_VERSION} (llama.cpp {LLAMA_CPP_COMMIT}, 'ggsq' version "
                           f"{STATE_SEQ_VERSION}): install that one (scripts/llamacpp-venv.sh)")


def restore(llm, cache: KvCache, tokens, *, layout: GgufLayout | None = None, seq_id: int = 0) -> None:
    """Restores the cache into a `llama_cpp.Llama` so that its next eval continues the prompt.

    llm must have been made with the cache types and flash attention it is restored with
    (type_k / type_v f32, f16 or bf16; flash_attn True or False, not auto).
    """
    import llama_cpp

    _check_llama_cpp(llama_cpp)
    tokens = [int(t) for t in tokens]
    if len(tokens) != cache.num_tokens:
        raise ValueError(f"{len(tokens)} tokens for a KV cache of {cache.num_tokens} positions")
    if len(tokens) >= llm.n_ctx():
        raise ValueError(f"the prompt's {len(tokens)} tokens do not fit llama.cpp's context of "
                         f"{llm.n_ctx()} with room to decode: make it with a larger n_ctx")
    if layout is None:
        layout = read_gguf_layout(llm.model_path)
    params = llm.context_params
    types = {v: k for k, v in GGML_TYPES.items()}
    if params.type_k not in types or params.type_v not in types:
        raise ValueError(f"llama.cpp context cache types {params.type_k}/{params.type_v} (ggml_type); "
                         "the state writer makes f32, f16 or bf16")
    fa = params.flash_attn_type
    if fa not in (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED):
        raise ValueError("make the Llama with flash_attn=True or False: under 'auto' llama.cpp picks the "
                         "V layout itself and the state must match it")
    data = seq_state_data(cache, layout, seq_id=seq_id, flash_attn=fa == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                          type_k=types[params.type_k], type_v=types[params.type_v])
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    llm.reset()
    got = llama_cpp.llama_state_seq_set_data(llm.ctx, buf, len(data), seq_id)
    if got != len(data):
        raise RuntimeError(f"llama.cpp restored {got} of the state's {len(data)} bytes (its log says why)")
    llm.input_ids[:len(tokens)] = tokens
    llm.n_tokens = len(tokens)
