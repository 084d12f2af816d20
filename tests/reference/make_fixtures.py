#!/usr/bin/env python3
"""Generate small reference fixtures for SLOPE's C++ tests from Hugging Face transformers.

Developer tool only (never run by CI). Regenerate with:

    /opt/slope-ref/bin/python tests/reference/make_fixtures.py

For each family (gpt_oss, gpt_oss_mxfp4, llama, qwen2, qwen3) it writes into
tests/reference/fixtures/<family>/:

  model/config.json, model/model.safetensors
      A tiny random-weight HF checkpoint (save_pretrained; for gpt_oss_mxfp4 the
      safetensors file is written by this script, see below).
  len_<N>.safetensors
      "tokens"          I64 [N]      the input ids (seeded random ints in [0, vocab))
      "logits"          F32 [vocab]  logits of the last position, float32 forward
      "layers.<i>.k"    F32 [N, num_kv_heads, head_dim]  K after RoPE (what the KV cache holds)
      "layers.<i>.v"    F32 [N, num_kv_heads, head_dim]  V
      All N positions are stored for every layer, sliding-window layers included.
  meta.json
      versions, lengths, dtypes, config summary and notes.

The reference forward always runs in float32 (eager attention, eager experts) on
weights that are exactly the stored (bf16 / f16 / f32 / MXFP4) values, upcast.

K/V capture: the model is run with an explicit `DynamicCache()` built WITHOUT a
config, so every layer (sliding ones too) is a plain `DynamicLayer` that keeps all
N positions.  (The default cache, `DynamicCache(config=...)`, uses
`DynamicSlidingWindowLayer` for sliding layers, which keeps only the last
`sliding_window - 1` tokens.)  The script cross-checks that
  * the logits equal those of a run with the default (sliding) cache,
  * the tail of every sliding layer in the default cache equals our full K/V, and
  * K/V equal an independent recomputation from forward hooks on k_proj/v_proj
    (plus k_norm for qwen3) and the model's own rotary embedding + apply_rotary_pos_emb.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import platform
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    DynamicCache,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "fixtures"
LENGTHS = [1, 7, 16, 33, 100, 257]
BASE_SEED = 20250601

# e2m1 code points, bit 3 = sign (section 3 of the gpt-oss reference notes)
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
MXFP4_SCALE_RANGE = (119, 123)  # inclusive e8m0 bytes -> 2^-8 .. 2^-4
MXFP4_MODULES_TO_NOT_CONVERT = [
    "model.layers.*.self_attn",
    "model.layers.*.mlp.router",
    "model.embed_tokens",
    "lm_head",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def log(*a):
    print(*a, flush=True)


def family_seed(name: str, salt: str = "") -> int:
    h = hashlib.sha256(f"{BASE_SEED}:{name}:{salt}".encode()).digest()
    return int.from_bytes(h[:4], "little")


# --------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------

def gpt_oss_config() -> GptOssConfig:
    return GptOssConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size=64,
        sliding_window=16,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 256,
            "truncate": False,
        },
        rope_theta=150000.0,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        attention_bias=True,
        swiglu_limit=7.0,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )


def llama_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def qwen2_config() -> Qwen2Config:
    return Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        tie_word_embeddings=False,
        torch_dtype="float16",
    )


def qwen3_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        attention_bias=False,
        use_sliding_window=False,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )


FAMILIES = {
    # name: (config fn, model class, storage dtype, mxfp4 experts)
    "gpt_oss": (gpt_oss_config, GptOssForCausalLM, "bfloat16", False),
    "gpt_oss_mxfp4": (gpt_oss_config, GptOssForCausalLM, "bfloat16", True),
    "llama": (llama_config, LlamaForCausalLM, "float32", False),
    "qwen2": (qwen2_config, Qwen2ForCausalLM, "float16", False),
    "qwen3": (qwen3_config, Qwen3ForCausalLM, "bfloat16", False),
}


# --------------------------------------------------------------------------------------
# Random weights
# --------------------------------------------------------------------------------------

def randomize_(model: torch.nn.Module, config, gen: torch.Generator) -> None:
    """Overwrite every parameter with seeded random values (in sorted-name order).

    Scales are chosen so activations stay O(1), attention is non-trivial, routing varies,
    the SwiGLU clamp (limit 7) is sometimes hit, and the sinks matter."""
    H = config.hidden_size

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            shape = tuple(p.shape)
            if name.endswith("norm.weight"):  # input/post_attention/final norm, q_norm, k_norm
                v = normal(shape, 0.1, 1.0)
            elif name.endswith("embed_tokens.weight"):
                v = normal(shape, 1.0)
            elif name == "lm_head.weight":
                v = normal(shape, 1.0 / math.sqrt(H))
            elif name.endswith("self_attn.sinks"):
                v = normal(shape, 1.0)
            elif name.endswith("mlp.router.weight"):
                v = normal(shape, 0.3)  # logits std ~2.4 for unit-RMS input: routing varies
            elif name.endswith("mlp.router.bias"):
                v = normal(shape, 0.5)
            elif name.endswith("experts.gate_up_proj"):  # [E, H, 2I]
                v = normal(shape, 0.3)  # pre-activation std ~2.4 -> clamp at 7 sometimes hit
            elif name.endswith("experts.down_proj"):  # [E, I, H]
                v = normal(shape, 0.5 / math.sqrt(shape[1]))
            elif name.endswith("experts.gate_up_proj_bias") or name.endswith("experts.down_proj_bias"):
                v = normal(shape, 0.5)
            elif name.endswith(".bias"):  # q/k/v/o biases
                v = normal(shape, 0.2)
            elif name.endswith(".weight") and len(shape) == 2:  # q/k/v/o, gate/up/down_proj
                v = normal(shape, 1.0 / math.sqrt(shape[1]))
            else:
                raise RuntimeError(f"randomize_: no rule for parameter {name} {shape}")
            p.copy_(v.to(p.dtype))


# --------------------------------------------------------------------------------------
# MXFP4
# --------------------------------------------------------------------------------------

def mxfp4_decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Own implementation of the documented decode.

    blocks U8 [E, rows, G, 16], scales U8 [E, rows, G]; rows = output features, 32-element
    blocks along the input dim, byte j -> element 2j (low nibble), 2j+1 (high nibble),
    value = FP4[nib] * 2^(scale-127).  Returns float32 [E, in, out] (HF `x @ W` layout)."""
    b = blocks.numpy().astype(np.int64)
    s = scales.numpy().astype(np.int64)
    lut = np.array(FP4_VALUES, dtype=np.float64)
    E, R, G, B = b.shape
    vals = np.empty((E, R, G, 2 * B), dtype=np.float64)
    vals[..., 0::2] = lut[b & 0xF]
    vals[..., 1::2] = lut[b >> 4]
    vals = vals * np.exp2(s - 127)[..., None]
    w = vals.reshape(E, R, G * 2 * B)  # [E, out, in]
    return torch.from_numpy(np.ascontiguousarray(w.transpose(0, 2, 1)).astype(np.float32))


def make_mxfp4(shape_e_in_out, gen: torch.Generator):
    """Random MXFP4 tensor for an HF expert weight of shape [E, in, out]."""
    E, K, R = shape_e_in_out
    assert K % 32 == 0
    G = K // 32
    blocks = torch.randint(0, 256, (E, R, G, 16), generator=gen, dtype=torch.int64).to(torch.uint8)
    lo, hi = MXFP4_SCALE_RANGE
    scales = torch.randint(lo, hi + 1, (E, R, G), generator=gen, dtype=torch.int64).to(torch.uint8)
    return blocks, scales


# --------------------------------------------------------------------------------------
# Save / load helpers
# --------------------------------------------------------------------------------------

def save_model(model, model_dir: Path):
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True
    model.save_pretrained(str(model_dir), **kwargs)
    assert (model_dir / "model.safetensors").is_file(), "expected a single model.safetensors"


def add_legacy_config_keys(model_dir: Path, storage_dtype: str) -> None:
    """transformers 5 writes `rope_parameters` (with rope_theta inside) and `dtype`.
    Checkpoints on the Hub use top-level `rope_theta`, `rope_scaling` and `torch_dtype`.
    Write both spellings (consistent) so the C++ parser sees what real checkpoints contain;
    load_and_check() verifies that transformers reads the file back unchanged."""
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    rp = cfg.get("rope_parameters")
    if rp is not None and "rope_theta" in rp:
        cfg["rope_theta"] = rp["rope_theta"]
        scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
        cfg["rope_scaling"] = scaling if scaling.get("rope_type", "default") != "default" else None
    cfg["torch_dtype"] = storage_dtype
    cfg.setdefault("dtype", storage_dtype)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def loading_info_ok(info) -> None:
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise AssertionError(f"from_pretrained loading info not clean: {bad}")


def get_cache_kv(cache, layer: int):
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]  # older transformers


def forward(model, ids: torch.Tensor, cache):
    params = inspect.signature(model.forward).parameters
    kw = {"use_cache": True}
    if cache is not None:
        kw["cache" if "cache" in params else "past_key_values"] = cache
    out = model(input_ids=ids, **kw)
    out_cache = getattr(out, "cache", None)
    if out_cache is None:
        out_cache = getattr(out, "past_key_values", None)
    return out.logits, out_cache


# --------------------------------------------------------------------------------------
# Independent float64 implementation of the documented math (not transformers)
# --------------------------------------------------------------------------------------

def spec_inv_freq(cfg: dict, hd: int):
    """RoPE inverse frequencies + cos/sin multiplier, read from the Hub-style keys
    (rope_theta, rope_scaling) of config.json; see shared/reference/gpt-oss-model.md s.2."""
    theta = float(cfg["rope_theta"])
    sc = cfg.get("rope_scaling") or {"rope_type": "default"}
    i = np.arange(hd // 2, dtype=np.float64)
    pos_freq = theta ** (2 * i / hd)
    inv = 1.0 / pos_freq
    mscale = 1.0
    rt = sc.get("rope_type", sc.get("type"))
    if rt == "yarn":
        f, orig = float(sc["factor"]), float(sc["original_max_position_embeddings"])

        def corr(beta):
            return hd * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(theta))

        low, high = corr(float(sc["beta_fast"])), corr(float(sc["beta_slow"]))
        if sc.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, hd - 1)
        ramp = np.clip((i - low) / (high - low), 0, 1)
        inv = (1.0 / (f * pos_freq)) * ramp + (1.0 / pos_freq) * (1 - ramp)
        mscale = 0.1 * math.log(f) + 1.0
    elif rt == "llama3":
        f, lo, hi = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        orig = float(sc["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (orig / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / f + smooth * inv
        inv = np.where(wavelen > orig / lo, inv / f, np.where(wavelen < orig / hi, inv, mid))
    elif rt != "default":
        raise ValueError(rt)
    return torch.from_numpy(inv), mscale


def spec_forward(model_dir: Path, tokens: torch.Tensor):
    """Returns (last-position logits, {layer: (K [N,kv,hd], V)}) in float64."""
    cfg = json.loads((model_dir / "config.json").read_text())
    W = {}
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        for k in f.keys():
            W[k] = f.get_tensor(k)
    for k in [k for k in W if k.endswith("_blocks")]:
        base = k[: -len("_blocks")]
        W[base] = mxfp4_decode(W.pop(k), W.pop(base + "_scales"))
    W = {k: v.double() for k, v in W.items()}
    mt = cfg["model_type"]
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    n = tokens.shape[0]
    inv, msc = spec_inv_freq(cfg, hd)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang) * msc, torch.sin(ang) * msc  # [N, hd/2]

    def rms(x, w):
        return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))

    def rope(x):  # [N, heads, hd], NeoX half rotation
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def lin(x, name, bias=True):
        y = x @ W[name + ".weight"].T
        b = W.get(name + ".bias") if bias else None
        return y + b if b is not None else y

    h = W["model.embed_tokens.weight"][tokens]
    layer_types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    kv = {}
    qi = torch.arange(n)[:, None]
    kj = torch.arange(n)[None, :]
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."
        x = rms(h, W[p + "input_layernorm.weight"])
        q = lin(x, p + "self_attn.q_proj").view(n, nh, hd)
        k = lin(x, p + "self_attn.k_proj").view(n, nkv, hd)
        v = lin(x, p + "self_attn.v_proj").view(n, nkv, hd)
        if mt == "qwen3":
            q = rms(q, W[p + "self_attn.q_norm.weight"])
            k = rms(k, W[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        kv[li] = (k, v)
        rep = nh // nkv
        kk = k.repeat_interleave(rep, dim=1)  # q head h uses kv head h // rep
        vv = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(hd)
        allowed = kj <= qi
        if layer_types[li] == "sliding_attention":
            allowed = allowed & (kj > qi - cfg["sliding_window"])
        s = s.masked_fill(~allowed[None], float("-inf"))
        if mt == "gpt_oss":
            sink = W[p + "self_attn.sinks"][:, None, None]  # [nh,1,1]
            m = torch.maximum(s.amax(-1, keepdim=True), sink)
            e = torch.exp(s - m)
            pr = e / (e.sum(-1, keepdim=True) + torch.exp(sink - m))
        else:
            pr = torch.softmax(s, -1)
        o = torch.einsum("hqk,khd->qhd", pr, vv).reshape(n, nh * hd)
        h = h + lin(o, p + "self_attn.o_proj")
        x = rms(h, W[p + "post_attention_layernorm.weight"])
        if mt == "gpt_oss":
            g = lin(x, p + "mlp.router")
            topv, topi = torch.topk(g, cfg["num_experts_per_tok"], dim=-1)
            wts = torch.softmax(topv, -1)
            lim = cfg["swiglu_limit"]
            y = torch.zeros_like(x)
            e = p + "mlp.experts."
            for t in range(n):
                for kx in range(topi.shape[1]):
                    ex = int(topi[t, kx])
                    gu = x[t] @ W[e + "gate_up_proj"][ex] + W[e + "gate_up_proj_bias"][ex]
                    G = gu[0::2].clamp(max=lim)
                    U = gu[1::2].clamp(-lim, lim)
                    a = (U + 1) * G * torch.sigmoid(1.702 * G)
                    y[t] += wts[t, kx] * (a @ W[e + "down_proj"][ex] + W[e + "down_proj_bias"][ex])
        else:
            gt = lin(x, p + "mlp.gate_proj", bias=False)
            up = lin(x, p + "mlp.up_proj", bias=False)
            y = lin(gt * torch.sigmoid(gt) * up, p + "mlp.down_proj", bias=False)
        h = h + y
    h = rms(h, W["model.norm.weight"])
    logits = h[-1] @ W["lm_head.weight"].T
    return logits, kv


# --------------------------------------------------------------------------------------
# Family generation
# --------------------------------------------------------------------------------------

def build_checkpoint(family: str, out_dir: Path, notes: list) -> dict:
    cfg_fn, cls, storage, mxfp4 = FAMILIES[family]
    config = cfg_fn()
    torch.manual_seed(family_seed(family, "init"))  # HF init (overwritten anyway)
    model = cls(config).to(torch.float32).eval()
    # gpt_oss_mxfp4 shares its non-expert weights with gpt_oss (same seed): only experts differ.
    gen = torch.Generator().manual_seed(family_seed("gpt_oss" if mxfp4 else family, "weights"))
    randomize_(model, config, gen)
    model = model.to(DTYPES[storage])  # the stored values; the reference upcasts exactly these

    model_dir = out_dir / "model"
    model_dir.mkdir(parents=True)
    extra = {}
    if not mxfp4:
        save_model(model, model_dir)
    else:
        save_model(model, model_dir)  # writes config.json (+ a bf16 file we replace below)
        sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        mgen = torch.Generator().manual_seed(family_seed(family, "mxfp4"))
        decoded = {}
        for li in range(config.num_hidden_layers):
            pre = f"model.layers.{li}.mlp.experts."
            for proj in ("gate_up_proj", "down_proj"):
                w = sd.pop(pre + proj)  # [E, in, out]
                blocks, scales = make_mxfp4(tuple(w.shape), mgen)
                sd[pre + proj + "_blocks"] = blocks
                sd[pre + proj + "_scales"] = scales
                decoded[pre + proj] = mxfp4_decode(blocks, scales)
                assert tuple(decoded[pre + proj].shape) == tuple(w.shape)
        save_file(sd, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
        cfgj = json.loads((model_dir / "config.json").read_text())
        cfgj["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": MXFP4_MODULES_TO_NOT_CONVERT,
        }
        (model_dir / "config.json").write_text(json.dumps(cfgj, indent=2, sort_keys=True) + "\n")
        extra["decoded"] = decoded
        # cross-check own decode against transformers' convert_moe_packed_tensors
        try:
            from transformers.integrations.mxfp4 import convert_moe_packed_tensors

            for name, ref in decoded.items():
                hf = convert_moe_packed_tensors(sd[name + "_blocks"], sd[name + "_scales"], dtype=torch.float32)
                if not torch.equal(hf, ref):
                    raise AssertionError(f"own MXFP4 decode != convert_moe_packed_tensors for {name}")
                hf16 = convert_moe_packed_tensors(sd[name + "_blocks"], sd[name + "_scales"], dtype=torch.bfloat16)
                if not torch.equal(hf16.float(), ref):
                    raise AssertionError(f"MXFP4 values not exact in bf16 for {name}")
            notes.append(
                "Own MXFP4 decode equals transformers.integrations.mxfp4.convert_moe_packed_tensors "
                "bit-exactly (float32 and bfloat16 outputs) for every expert tensor."
            )
        except ImportError as e:  # pragma: no cover
            notes.append(f"convert_moe_packed_tensors not importable ({e}); own decode only.")
    add_legacy_config_keys(model_dir, storage)
    # expected float32 parameters (for the load-back check)
    expected = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    if mxfp4:
        expected.update(extra["decoded"])
    return {"config": config, "cls": cls, "storage": storage, "mxfp4": mxfp4, "expected": expected,
            "model_dir": model_dir}


def load_reference(info: dict, notes: list):
    cls, model_dir = info["cls"], info["model_dir"]
    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if info["cls"] is GptOssForCausalLM:
        kwargs["experts_implementation"] = "eager"
    method = "from_pretrained"
    if info["mxfp4"]:
        try:
            model, linfo = cls.from_pretrained(str(model_dir), **kwargs)
            method = "from_pretrained (plain; transformers dequantised on CPU)"
        except Exception as e:  # e.g. needs `accelerate` / triton / kernels
            log(f"  plain MXFP4 from_pretrained failed: {type(e).__name__}: {e}")
            notes.append(f"Plain from_pretrained of the MXFP4 checkpoint failed on CPU: {type(e).__name__}: "
                         f"{str(e).splitlines()[0]}")
            from transformers import Mxfp4Config

            model, linfo = cls.from_pretrained(
                str(model_dir), quantization_config=Mxfp4Config(dequantize=True), **kwargs
            )
            method = "from_pretrained(quantization_config=Mxfp4Config(dequantize=True))"
        notes.append(f"MXFP4 reference model loaded via {method}.")
    else:
        model, linfo = cls.from_pretrained(str(model_dir), **kwargs)
    loading_info_ok(linfo)
    model = model.float().eval()
    # every loaded parameter must equal the stored value upcast to f32 (MXFP4: own decode)
    sd = model.state_dict()
    exp = info["expected"]
    if set(sd) != set(exp):
        raise AssertionError(f"param name mismatch: {sorted(set(sd) ^ set(exp))}")
    for k, v in sd.items():
        if v.dtype != torch.float32:
            raise AssertionError(f"{k} is {v.dtype} after .float()")
        if not torch.equal(v, exp[k]):
            raise AssertionError(f"loaded {k} differs from the stored values (max diff "
                                 f"{(v - exp[k]).abs().max().item()})")
    # the config must have round-tripped (incl. the legacy keys we added)
    a, b = model.config.to_dict(), info["config"].to_dict()
    for key in ("rope_parameters", "layer_types", "sliding_window", "head_dim", "num_key_value_heads",
                "rms_norm_eps", "vocab_size", "num_hidden_layers", "intermediate_size"):
        if a.get(key) != b.get(key):
            raise AssertionError(f"config key {key} changed on reload: {b.get(key)} -> {a.get(key)}")
    return model, method


def head_dim_of(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def hook_kv(model, ids: torch.Tensor):
    """Independent K/V: hooks on k_proj/v_proj (+k_norm) and the model's own rotary + apply_rotary_pos_emb."""
    cfg = model.config
    hd = head_dim_of(cfg)
    layers = model.model.layers
    cap = {}
    handles = []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        handles.append(attn.k_proj.register_forward_hook(lambda m, a, o, i=i: cap.__setitem__(("k", i), o.detach())))
        handles.append(attn.v_proj.register_forward_hook(lambda m, a, o, i=i: cap.__setitem__(("v", i), o.detach())))
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    n = ids.shape[1]
    pos = torch.arange(n).unsqueeze(0)
    mod = sys.modules[type(model.model.layers[0].self_attn).__module__]
    out = {}
    with torch.no_grad():
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            k = cap[("k", i)].view(1, n, -1, hd)
            if hasattr(attn, "k_norm"):
                k = attn.k_norm(k)
            k = k.transpose(1, 2)
            v = cap[("v", i)].view(1, n, -1, hd).transpose(1, 2)
            x = k
            cos, sin = model.model.rotary_emb(x, pos)
            _, k_rot = mod.apply_rotary_pos_emb(k, k, cos, sin)
            out[i] = (k_rot, v)
    return out


def generate_family(family: str, root: Path, lengths: list[int]) -> dict:
    log(f"== {family}")
    out_dir = root / family
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    notes: list[str] = []
    info = build_checkpoint(family, out_dir, notes)
    model, method = load_reference(info, notes)
    cfg = model.config
    L = cfg.num_hidden_layers
    layer_types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * L)
    sliding = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
    stats = {}
    for n in lengths:
        g = torch.Generator().manual_seed(family_seed(family, f"tokens{n}"))
        tokens = torch.randint(0, cfg.vocab_size, (n,), generator=g, dtype=torch.int64)
        ids = tokens.unsqueeze(0)
        with torch.no_grad():
            full_cache = DynamicCache()  # no config: every layer keeps all positions
            logits, c1 = forward(model, ids, full_cache)
            logits2, c2 = forward(model, ids, DynamicCache())
            logits_def, cdef = forward(model, ids, None)  # default cache: sliding layers truncated
        if not torch.isfinite(logits).all():
            raise AssertionError(f"{family} N={n}: non-finite logits")
        if not torch.equal(logits, logits2):
            raise AssertionError(f"{family} N={n}: second run differs (non-deterministic)")
        if not torch.equal(logits, logits_def):
            d = (logits - logits_def).abs().max().item()
            if d > 1e-5:
                raise AssertionError(f"{family} N={n}: full-cache vs default-cache logits differ by {d}")
            notes.append(f"N={n}: full-cache vs default-cache logits differ by {d:.3g} (not bitwise).")
        hk = hook_kv(model, ids)
        tensors = {"tokens": tokens.contiguous(), "logits": logits[0, -1].float().contiguous()}
        for i in range(L):
            k, v = get_cache_kv(c1, i)
            k2, v2 = get_cache_kv(c2, i)
            assert k.shape == (1, cfg.num_key_value_heads, n, head_dim_of(cfg)), (family, n, i, k.shape)
            assert torch.equal(k, k2) and torch.equal(v, v2)
            kd, vd = get_cache_kv(cdef, i)
            keep = kd.shape[2]
            if i in sliding:
                expect_keep = min(n, cfg.sliding_window - 1)
                if keep not in (n, expect_keep):
                    raise AssertionError(f"unexpected default sliding cache length {keep} (N={n})")
            else:
                assert keep == n
            if not (torch.equal(kd, k[:, :, n - keep:]) and torch.equal(vd, v[:, :, n - keep:])):
                raise AssertionError(f"{family} N={n} layer {i}: default-cache K/V != tail of full K/V")
            hk_k, hk_v = hk[i]
            dk = (hk_k - k).abs().max().item()
            dv = (hk_v - v).abs().max().item()
            if dk > 1e-5 or dv > 1e-5:
                raise AssertionError(f"{family} N={n} layer {i}: hook K/V mismatch dk={dk} dv={dv}")
            tensors[f"layers.{i}.k"] = k[0].transpose(0, 1).float().contiguous()  # [N, kv, hd]
            tensors[f"layers.{i}.v"] = v[0].transpose(0, 1).float().contiguous()
            if i in sliding:
                stats.setdefault("default_sliding_cache_len", {})[str(n)] = keep
        save_file(tensors, str(out_dir / f"len_{n}.safetensors"), metadata={"fixture": f"{family} len {n}"})  # 1 key: byte-stable
        # independent float64 implementation of the documented math vs the transformers fixture
        sl, skv = spec_forward(info["model_dir"], tokens)
        dl = (sl - tensors["logits"].double()).abs().max().item()
        dkv = max(
            max((skv[i][0] - tensors[f"layers.{i}.k"].double()).abs().max().item(),
                (skv[i][1] - tensors[f"layers.{i}.v"].double()).abs().max().item())
            for i in range(L)
        )
        stats.setdefault("spec_f64_max_abs_diff_logits", {})[str(n)] = float(f"{dl:.3g}")
        stats.setdefault("spec_f64_max_abs_diff_kv", {})[str(n)] = float(f"{dkv:.3g}")
        if dl > 1e-3 or dkv > 1e-3:
            raise AssertionError(f"{family} N={n}: spec f64 reference differs: logits {dl}, kv {dkv}")
        top = torch.topk(tensors["logits"], 3)
        log(f"  N={n:4d}  logits[-1] top3 ids={top.indices.tolist()} "
            f"absmax={tensors['logits'].abs().max().item():.3f}  spec-f64 diff logits {dl:.2g} kv {dkv:.2g}")
    # routing variety check (gpt_oss): how many distinct expert sets were used at N=max
    if isinstance(model, GptOssForCausalLM):
        n = max(lengths)
        g = torch.Generator().manual_seed(family_seed(family, f"tokens{n}"))
        ids = torch.randint(0, cfg.vocab_size, (1, n), generator=g, dtype=torch.int64)
        routed = []
        clamp_hits = [0, 0]
        hs = []
        for layer in model.model.layers:
            hs.append(layer.mlp.router.register_forward_hook(
                lambda m, a, o: routed.append(torch.bincount(o[2].flatten(), minlength=cfg.num_local_experts))))

            def gate_hook(m, a, o):
                x, idx, _w = a[0], a[1], a[2]
                for e in range(cfg.num_local_experts):
                    tok = (idx == e).any(-1)
                    gu = x[tok] @ m.gate_up_proj[e] + m.gate_up_proj_bias[e]
                    clamp_hits[0] += int((gu[..., ::2] > cfg.swiglu_limit).sum())
                    clamp_hits[1] += int(gu[..., ::2].numel())
            hs.append(layer.mlp.experts.register_forward_hook(gate_hook))
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
        for h in hs:
            h.remove()
        stats["expert_token_counts_per_layer"] = [r.tolist() for r in routed]
        stats["gate_values_above_swiglu_limit"] = f"{clamp_hits[0]}/{clamp_hits[1]}"
        log(f"  expert usage per layer (N={n}): {stats['expert_token_counts_per_layer']}; "
            f"gate>limit {stats['gate_values_above_swiglu_limit']}")
        if any((r == 0).any() for r in routed):
            raise AssertionError("some expert never routed to; increase router weight std")

    storage = info["storage"]
    notes += [
        "Reference forward: float32 (weights upcast exactly from the stored dtype), attn_implementation='eager'"
        + (", experts_implementation='eager'" if isinstance(model, GptOssForCausalLM) else "") + ", CPU.",
        "K/V: from a use_cache=True forward with an explicit config-less DynamicCache(): all layers are plain "
        "DynamicLayer and keep all N positions (incl. sliding layers). Cross-checked against the default "
        "DynamicCache(config) (its DynamicSlidingWindowLayer keeps only the last sliding_window-1 positions; the "
        "tail matches) and against k_proj/v_proj forward hooks + the model's rotary_emb/apply_rotary_pos_emb.",
        "An independent float64 implementation of the documented math (spec_forward: reads config.json's "
        "Hub-style rope_theta/rope_scaling keys and model.safetensors directly) matches logits and K/V; max abs "
        "diffs are in stats.spec_f64_max_abs_diff_*.",
        "Logits of the whole sequence were bitwise identical over two runs (determinism) and finite.",
        "config.json: transformers 5 writes rope_parameters (with rope_theta inside) and dtype; this script also "
        "adds the Hub-style top-level rope_theta, rope_scaling (null when rope_type is default) and torch_dtype, "
        "consistent with them; reload verified.",
    ]
    if isinstance(model, GptOssForCausalLM):
        notes.append("gpt-oss eager attention runs the (sink-augmented) softmax in the model dtype: float32 here.")
    else:
        notes.append("Eager attention softmax is float32 (dtype=torch.float32) regardless of model dtype.")
    if info["mxfp4"]:
        notes.append(
            "Experts stored as MXFP4 by this script: <proj>_blocks U8 [E, out, in/32, 16] and <proj>_scales U8 "
            "[E, out, in/32] (rows = output features, gate_up rows interleave gate/up, low nibble = even element, "
            f"e8m0 scale bytes uniform in {list(MXFP4_SCALE_RANGE)}); gate_up_proj_bias/down_proj_bias bf16. "
            "Non-expert weights are identical to the gpt_oss family's.")
    meta = {
        "family": family,
        "model_type": cfg.model_type,
        "architecture": type(model).__name__,
        "storage_dtype": storage if not info["mxfp4"] else "bfloat16 + mxfp4 experts (U8 blocks/scales)",
        "reference_dtype": "float32",
        "reference_load_method": method,
        "lengths": lengths,
        "token_seed_note": "tokens for len_N come from torch.Generator seeded with sha256(BASE_SEED:family:tokensN)",
        "base_seed": BASE_SEED,
        "tensors": {
            "tokens": "I64 [N]",
            "logits": "F32 [vocab_size] (last position)",
            "layers.<i>.k": "F32 [N, num_key_value_heads, head_dim], after RoPE (and k_norm for qwen3)",
            "layers.<i>.v": "F32 [N, num_key_value_heads, head_dim]",
        },
        "config_summary": {
            k: getattr(cfg, k, None)
            for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "intermediate_size", "rms_norm_eps",
                      "max_position_embeddings", "rope_parameters", "layer_types", "sliding_window",
                      "num_local_experts", "num_experts_per_tok", "swiglu_limit", "attention_bias")
            if getattr(cfg, k, None) is not None
        },
        "head_dim": head_dim_of(cfg),
        "stats": stats,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
            "safetensors": __import__("safetensors").__version__,
        },
        "notes": notes,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--families", nargs="*", default=list(FAMILIES))
    ap.add_argument("--lengths", nargs="*", type=int, default=LENGTHS)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # bitwise reproducibility across machines/thread counts is more likely
    for fam in args.families:
        if fam not in FAMILIES:
            sys.exit(f"unknown family {fam}; choose from {list(FAMILIES)}")
        generate_family(fam, args.out, sorted(args.lengths))
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    log(f"total fixture size: {total / 1e6:.2f} MB under {args.out}")


if __name__ == "__main__":
    main()
