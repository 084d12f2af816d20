"""Hugging Face transformers as a decode engine: continue generating from SLOPE's KV cache.

`to_dynamic_cache` fills a `transformers.DynamicCache` (transformers 5.24) with a `KvCache`, laid
out exactly as transformers' own prefill of the same prompt leaves it:

- a full-attention layer (`DynamicLayer`) holds K and V of all N prompt positions, as torch
  tensors [1, num_kv_heads, N, head_dim];
- a sliding-window layer (`DynamicSlidingWindowLayer`, gpt-oss's `sliding_attention` layers, window
  W = `config.sliding_window`) holds only the last min(N, W - 1) positions and counts all N
  (`cumulative_length`): the next token attends to itself and the W - 1 before it, so the older
  rows are never read again.

`generate_from_kv` then runs `model.generate` on from that cache. The convention for the first new
token: it is the prefill's own (SLOPE computed the last prompt position's logits, so it is
`KvCache.first_token`, or `slope run --json`'s `first_token`). transformers does not recompute
the last prompt position; it feeds the first token on top of the N cached positions, and every
later token is its own decode step over SLOPE's KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache import KvCache

FNV1A64_OFFSET = 0xCBF29CE484222325
FNV1A64_PRIME = 0x100000001B3


def tokens_hash(tokens) -> str:
    """FNV-1a 64 over the token ids as 4-byte little-endian integers: the shards' `tokens_hash`."""
    h = FNV1A64_OFFSET
    for byte in np.asarray(tokens, dtype="<u4").tobytes():
        h = ((h ^ byte) * FNV1A64_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def _layer_rows(cache: KvCache, i: int, keep: int, what: str):
    """The last `keep` positions of layer i as (k, v) [keep, heads, head_dim] numpy views."""
    layer = cache.layers[i]
    n = cache.num_tokens
    if layer.first_position > n - keep:
        raise ValueError(
            f"layer {i} holds positions {layer.first_position}..{n - 1}, but transformers' {what} needs the last "
            f"{keep} ({n - keep}..{n - 1}); pull it with a wider window (window_trim=False) or from the shard files")
    begin = n - keep - layer.first_position
    return layer.k[begin:], layer.v[begin:]


def to_dynamic_cache(cache: KvCache, config, device=None, dtype=None):
    """A transformers `DynamicCache(config=config)` holding `cache`, as transformers' own prefill leaves it.

    config: the model's `PretrainedConfig` (`model.config`). device, dtype: of the cache tensors
    (default: CPU, float32; pass the model's for a model in another dtype or on a GPU). Raises
    ValueError when the cache does not fit the model (layers, KV heads, head size, windows).
    """
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    cache.check()
    text = config.get_text_config(decoder=True)
    archs = getattr(config, "architectures", None) or []
    if cache.architecture and archs and cache.architecture not in archs:
        raise ValueError(f"the KV cache is of a {cache.architecture} model, the config is of {', '.join(archs)}")
    hkv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if (cache.num_kv_heads, cache.head_dim) != (hkv, head_dim):
        raise ValueError(f"the KV cache has {cache.num_kv_heads} KV heads of {cache.head_dim}, "
                         f"the model {hkv} of {head_dim}: a different model")

    dc = DynamicCache(config=config)
    if len(dc.layers) != len(cache.layers):
        raise ValueError(f"the KV cache has {len(cache.layers)} layers, the model {len(dc.layers)}")
    n = cache.num_tokens
    dtype = dtype or torch.float32
    for i, layer in enumerate(dc.layers):
        window = cache.layers[i].window
        if isinstance(layer, DynamicSlidingWindowLayer):
            if window != layer.sliding_window:
                raise ValueError(f"layer {i}: the KV cache's window is {window}, the model's {layer.sliding_window}")
            # transformers keeps the last W - 1 rows (DynamicSlidingWindowLayer.update).
            keep = min(n, layer.sliding_window - 1)
            k, v = _layer_rows(cache, i, keep, f"sliding layer (window {layer.sliding_window})")
        elif type(layer) is DynamicLayer:
            if window != 0:
                raise ValueError(f"layer {i}: the KV cache's layer has a window of {window}, "
                                 "the model's is full attention")
            k, v = _layer_rows(cache, i, n, "full-attention layer")
        else:
            raise ValueError(f"layer {i}: transformers made a {type(layer).__name__} for it; only full and "
                             "sliding-window attention layers can be filled from SLOPE's KV")
        # [rows, heads, head_dim] -> [1, heads, rows, head_dim], transformers' layout.
        kt = torch.from_numpy(np.ascontiguousarray(k)).permute(1, 0, 2).unsqueeze(0).to(device=device, dtype=dtype)
        vt = torch.from_numpy(np.ascontiguousarray(v)).permute(1, 0, 2).unsqueeze(0).to(device=device, dtype=dtype)
        layer.update(kt.contiguous(), vt.contiguous())
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length = n  # every prompt position was seen, not only the rows kept
    return dc


@dataclass
class Continuation:
    """What `generate_from_kv` produced.

    tokens: the max_new_tokens new token ids; tokens[0] is the prefill's first token.
    logits: torch float tensor [max_new_tokens - 1, vocab], the raw logits transformers computed
        for tokens[1:] (row s gave tokens[s + 1]); the first token's logits are the prefill's own
        (`slope run --logits-out`).
    cache: the DynamicCache after generating (prompt, then every new token but the last).
    """

    tokens: list[int]
    logits: object
    cache: object


def generate_from_kv(model, prompt_ids, cache: KvCache, max_new_tokens: int, first_token: int | None = None,
                     **generate_kwargs) -> Continuation:
    """Greedy `model.generate` continuing the prompt from SLOPE's KV cache, without recomputing it.

    prompt_ids: the prompt's token ids (the N positions the cache holds; checked against the
    shards' `tokens_hash` when the cache has one). first_token: the prefill's first generated
    token; default `cache.first_token`. generate_kwargs go to `model.generate` (greedy unless
    they say otherwise).
    """
    import torch

    prompt = [int(t) for t in np.asarray(prompt_ids).reshape(-1)]
    if len(prompt) != cache.num_tokens:
        raise ValueError(f"the prompt has {len(prompt)} tokens, the KV cache {cache.num_tokens}")
    want = cache.meta.get("tokens_hash")
    if want is not None and tokens_hash(prompt) != want:
        raise ValueError(f"the prompt's tokens_hash is {tokens_hash(prompt)}, the KV cache's {want}: "
                         "the KV is of a different prompt")
    first = cache.first_token if first_token is None else first_token
    if first is None:
        raise ValueError("the prefill's first token is unknown: pass first_token= (slope run --json prints it)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    vocab = model.config.get_text_config(decoder=True).vocab_size
    if not 0 <= int(first) < vocab:
        raise ValueError(f"first token {first} is outside the model's vocabulary of {vocab}")

    dc = to_dynamic_cache(cache, model.config, device=model.device, dtype=model.dtype)
    if max_new_tokens == 1:
        return Continuation([int(first)], torch.empty(0, vocab), dc)
    ids = torch.tensor([prompt + [int(first)]], device=model.device)
    kwargs = {"do_sample": False, **generate_kwargs}
    out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=dc,
                         max_new_tokens=max_new_tokens - 1, return_dict_in_generate=True, output_logits=True,
                         **kwargs)
    new = out.sequences[0, len(prompt) + 1:].tolist()
    return Continuation([int(first)] + new, torch.cat([l[:1] for l in out.logits]).float().cpu(), out.cache)
