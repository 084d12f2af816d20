#!/usr/bin/env python3
"""Check that a model directory written by `slope make-model ...` is a valid HF checkpoint.

Developer tool (not run by CI). Usage:

    /opt/slope-ref/bin/python tests/reference/check_make_model.py MODEL_DIR [--tokens 8] [--compare FIXTURE]

It loads MODEL_DIR with transformers (AutoModelForCausalLM.from_pretrained, float32,
eager attention, output_loading_info=True, ignore_mismatched_sizes=True so that shape
mismatches are reported rather than raised) and asserts:
  * no missing, unexpected or mismatched keys and no error messages,
  * every tensor stored in the *.safetensors files is consumed by the model,
  * a forward pass on a few seeded random tokens gives finite logits of shape [1, T, vocab],
    and a second run is bitwise identical.
For an MXFP4 checkpoint (quantization_config.quant_method == "mxfp4") it loads with
Mxfp4Config(dequantize=True), which works on CPU without accelerate/triton/kernels.

--compare FIXTURE: also compare against a len_<N>.safetensors file in the format written by
make_fixtures.py (tokens / logits / layers.<i>.k / layers.<i>.v), e.g. when MODEL_DIR holds the
same weights as a fixture model.  Exit status 0 = all checks passed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path


def fail(msg: str) -> None:
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--tokens", type=int, default=8, help="number of random tokens for the forward (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare", type=Path, default=None, help="len_<N>.safetensors fixture to compare against")
    ap.add_argument("--atol", type=float, default=1e-4, help="abs tolerance for --compare")
    args = ap.parse_args()

    import torch
    import transformers
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, DynamicCache

    d = args.model_dir
    if not (d / "config.json").is_file():
        fail(f"{d}/config.json not found")
    cfg_json = json.loads((d / "config.json").read_text())
    files = sorted(d.glob("*.safetensors"))
    if not files:
        fail(f"no *.safetensors in {d}")
    if len(files) > 1 and not (d / "model.safetensors.index.json").is_file():
        fail("several safetensors files but no model.safetensors.index.json")

    stored = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                if k in stored:
                    fail(f"tensor {k} stored twice")
                sl = sf.get_slice(k)
                stored[k] = (sl.get_dtype(), tuple(sl.get_shape()))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"model_type={cfg_json.get('model_type')} architectures={cfg_json.get('architectures')} "
          f"dtype={cfg_json.get('dtype', cfg_json.get('torch_dtype'))}")
    print(f"{len(stored)} tensors in {len(files)} file(s); dtypes: {dict(Counter(v[0] for v in stored.values()))}")

    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True,
                  ignore_mismatched_sizes=True)
    if cfg_json.get("model_type") == "gpt_oss":
        kwargs["experts_implementation"] = "eager"
    qc = cfg_json.get("quantization_config") or {}
    if qc.get("quant_method") == "mxfp4":
        from transformers import Mxfp4Config

        kwargs["quantization_config"] = Mxfp4Config(
            modules_to_not_convert=qc.get("modules_to_not_convert"), dequantize=True
        )
        print("MXFP4 checkpoint: loading with Mxfp4Config(dequantize=True)")

    model, info = AutoModelForCausalLM.from_pretrained(str(d), **kwargs)
    problems = [f"{key}: {sorted(map(str, val))}" for key in ("missing_keys", "unexpected_keys",
                "mismatched_keys", "error_msgs") if (val := info.get(key))]
    if problems:
        fail("; ".join(problems))
    print("loading info clean: no missing / unexpected / mismatched keys")

    model = model.float().eval()
    params = dict(model.named_parameters())
    for k in stored:
        base = k
        for suf in ("_blocks", "_scales"):
            if k.endswith(suf):
                base = k[: -len(suf)]
        if base not in params and k not in dict(model.named_buffers()):
            fail(f"stored tensor {k} does not map to a model parameter")
    for k, p in params.items():
        if k not in stored and k + "_blocks" not in stored:
            tied = getattr(model.config, "tie_word_embeddings", False) and k == "lm_head.weight"
            if not tied:
                fail(f"model parameter {k} is not stored in the checkpoint")
        if not torch.isfinite(p).all():
            fail(f"parameter {k} has non-finite values")

    cfg = model.config
    if args.compare is not None:
        from safetensors.torch import load_file

        fx = load_file(str(args.compare))
        tokens = fx["tokens"].to(torch.int64)
    else:
        g = torch.Generator().manual_seed(args.seed)
        tokens = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=g, dtype=torch.int64)
    ids = tokens.unsqueeze(0)
    with torch.no_grad():
        cache = DynamicCache()  # config-less: keeps all positions on every layer
        import inspect

        ckw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        out = model(input_ids=ids, use_cache=True, **{ckw: cache})
        out2 = model(input_ids=ids, use_cache=False)
    logits = out.logits
    if tuple(logits.shape) != (1, ids.shape[1], cfg.vocab_size):
        fail(f"logits shape {tuple(logits.shape)}")
    if not torch.isfinite(logits).all():
        fail("non-finite logits")
    if not torch.equal(logits, out2.logits):
        d_ = (logits - out2.logits).abs().max().item()
        if d_ > 1e-5:
            fail(f"forward with/without cache differs by {d_}")
    print(f"forward on {ids.shape[1]} tokens OK: logits finite, |logits|max={logits.abs().max().item():.4g}, "
          f"last argmax={int(logits[0, -1].argmax())}")

    if args.compare is not None:
        worst = (logits[0, -1] - fx["logits"]).abs().max().item()
        print(f"compare logits vs {args.compare.name}: max abs diff {worst:.3g}")
        cache_obj = getattr(out, "cache", None) or out.past_key_values
        for i in range(cfg.num_hidden_layers):
            layer = cache_obj.layers[i]
            for name, t in (("k", layer.keys), ("v", layer.values)):
                ref = fx.get(f"layers.{i}.{name}")
                if ref is None:
                    continue
                dd = (t[0].transpose(0, 1) - ref).abs().max().item()
                worst = max(worst, dd)
        print(f"compare logits+K/V: max abs diff {worst:.3g} (atol {args.atol})")
        if worst > args.atol:
            fail("comparison against fixture exceeds tolerance")
    print("PASS")


if __name__ == "__main__":
    main()
