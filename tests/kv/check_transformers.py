#!/usr/bin/env python3
"""transformers continues from SLOPE's KV cache exactly as from its own prefill.

usage: check_transformers.py SLOPE_BINARY FIXTURES_DIR [--mpirun MPIRUN] [--families F,...]
                             [--lengths N,...] [--meshes NAME,...] [--new-tokens K]

For each tiny fixture model (gpt_oss, gpt_oss_mxfp4, llama, qwen3), each prompt length (the
fixtures' fixed tokens of 7, 33 and 100: shorter and longer than gpt-oss's window of 16) and each
mesh (1 rank; ring 2; tp 2; pp 2; ring 2 x ulysses 2 on 4 ranks), SLOPE prefills at --dtype f32
with --kv-out, `load_kv_dir` assembles the shards and `generate_from_kv` greedily generates K
(16) tokens in transformers from that cache. The reference is independent of SLOPE:
transformers' own greedy `generate` of K tokens from the bare prompt, in float32.

Checked:
  - the cache `to_dynamic_cache` builds is laid out as transformers' own prefill leaves it (same
    layer classes, rows, sequence lengths; K/V within KV_TOL relative);
  - SLOPE's first token equals transformers' first generated token, and SLOPE's last-position
    logits (--logits-out) equal its first step's logits within LOGITS_TOL;
  - every generated token equals the reference, and each later step's logits are within
    LOGITS_TOL of the reference's;
  - the KV is really used (on the 4-rank mesh): one position's K moved in a full layer, and in a
    sliding layer inside its window, changes the logits by far more than LOGITS_TOL; moved in a
    sliding layer before its window (which transformers never reads again), nothing changes;
  - sliding layers trimmed to their last W rows, as the transfer sends them, decode the same;
  - bad input is refused with a clear error: another prompt, a sliding layer trimmed below what
    transformers keeps, another model's cache, an unknown first token.
Exit 0 only if every check passed; 77 (skipped) when torch/transformers are not importable.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache
except ImportError as e:
    print(f"SKIPPED: {e}; make the venv with scripts/kv-venv.sh and run this with its python", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from slope_client import KvCache, LayerKv, load_kv_dir  # noqa: E402
from slope_client.cache import read_safetensors  # noqa: E402
from slope_client.hf import generate_from_kv, to_dynamic_cache  # noqa: E402
from kv_serve import pull_after_prefill  # noqa: E402  (tests/kv, this script's directory)

# Both sides compute in float32; SLOPE's K/V and logits differ from transformers' by rounding
# (measured up to ~1e-5 relative on these models), so 1e-4 relative to the largest
# |logit| of the step (at least 1) leaves room and is still far below a real change (>= 1e-2).
LOGITS_TOL = 1e-4
KV_TOL = 1e-4
MESHES = {
    "1rank": (1, []),
    "ring2": (2, ["--ring", "2"]),
    "tp2": (2, ["--tp", "2"]),
    "pp2": (2, ["--pp", "2"]),
    "ring2xu2": (4, ["--ring", "2", "--ulysses", "2"]),
    # The same mesh, its KV pulled from every rank over TCP (`slope run --kv-serve`, slope_client.pull,
    # sliding layers sent as their last W rows) instead of read from --kv-out files.
    "ring2xu2-pull": (4, ["--ring", "2", "--ulysses", "2"]),
}
PERTURB_MESH = "ring2xu2"

failures = []
passed = 0


def check(ok, what):
    global passed
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if ok:
        passed += 1
    else:
        failures.append(what)
    return ok


def load_model(model_dir):
    config = transformers.AutoConfig.from_pretrained(model_dir)
    kwargs = {}
    if getattr(config, "quantization_config", None):
        # transformers' own CPU dequantisation of MXFP4 (its kernels path needs extra packages).
        kwargs["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs)
    return model.eval()


def reference(model, tokens, new_tokens):
    """transformers' own greedy generation from the bare prompt, and its own prefill's cache."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             return_dict_in_generate=True, output_logits=True)
        own = DynamicCache(config=model.config)
        model(ids, cache=own, use_cache=True)
    logits = torch.cat([l[:1] for l in out.logits]).float()
    return out.sequences[0, len(tokens):].tolist(), logits, own


def slope_prefill(args, model_dir, tokens, mesh, work):
    """Runs slope run on the mesh; returns (first token, last-position logits, KvCache): read from
    --kv-out's files, or for a "-pull" mesh pulled from the ranks of `slope run --kv-serve`."""
    ranks, flags = MESHES[mesh]
    tok_file = os.path.join(work, "tokens.txt")
    with open(tok_file, "w") as f:
        f.write(" ".join(map(str, tokens)))
    kv_dir = os.path.join(work, "kv")
    logits_file = os.path.join(work, "logits.f32")
    pulled = mesh.endswith("-pull")
    kv_flags = ["--kv-serve", "--kv-lease-s", "120"] if pulled else ["--kv-out", kv_dir, "--json"]
    cmd = [args.slope, "run", "--model", model_dir, "--tokens", tok_file, "--dtype", "f32", "--threads", "1",
           *kv_flags, "--logits-out", logits_file, "--quiet", *flags]
    if ranks > 1:
        cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism",
               "none", "-x", "OMP_NUM_THREADS=1", "-np", str(ranks), *cmd]
    if pulled:
        cache = pull_after_prefill(cmd)
        first = cache.first_token
    else:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
        first = int(json.loads(p.stdout.strip().splitlines()[-1])["first_token"])
        cache = load_kv_dir(kv_dir)
    return int(first), torch.from_numpy(np.fromfile(logits_file, dtype="<f4")), cache


def rel_err(a, b):
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


def logits_err(got, want):
    """The largest per-step error, each relative to its step's largest |logit|."""
    return max((rel_err(g, w) for g, w in zip(got, want)), default=0.0)


def check_layout(mine, own, what):
    same = len(mine.layers) == len(own.layers)
    err = 0.0
    for a, b in zip(mine.layers, own.layers):
        same = same and type(a) is type(b) and a.keys.shape == b.keys.shape and \
            a.get_seq_length() == b.get_seq_length() and a.get_mask_sizes(1) == b.get_mask_sizes(1)
        if a.keys.shape == b.keys.shape:
            err = max(err, rel_err(a.keys, b.keys), rel_err(a.values, b.values))
    check(same and err <= KV_TOL, f"{what}: the DynamicCache is laid out as transformers' prefill leaves it "
                                  f"(layers {[type(l).__name__[7:] for l in mine.layers]}, K/V rel err {err:.2e})")


def with_moved_k(cache, layer, position):
    """A copy of the cache with one position's K of one layer moved by a few times its scale."""
    layers = []
    for i, l in enumerate(cache.layers):
        k = l.k.copy()
        if i == layer:
            k[position - l.first_position] += 3.0 * float(np.abs(l.k).max())
        layers.append(LayerKv(k, l.v, l.first_position, l.window))
    return KvCache(cache.num_tokens, cache.num_kv_heads, cache.head_dim, cache.architecture, layers,
                   cache.first_token, dict(cache.meta))


def check_kv_is_used(model, tokens, cache, base, what):
    """Moving K where transformers reads it changes the decode; where it does not, nothing changes."""
    n = cache.num_tokens
    cases = []
    for i, l in enumerate(cache.layers):
        if l.window == 0:
            cases.append((i, 0, f"full layer {i}, position 0", True))
        else:
            cases.append((i, n - 1, f"sliding layer {i}, position {n - 1} (in its window)", True))
            if n >= l.window:
                p = n - l.window  # the newest position the next token no longer sees
                cases.append((i, p, f"sliding layer {i}, position {p} (before its window)", False))
    for layer, pos, where, matters in cases:
        got = generate_from_kv(model, tokens, with_moved_k(cache, layer, pos), len(base.tokens))
        err = logits_err(got.logits, base.logits)
        if matters:
            tokens_now = "differ" if got.tokens != base.tokens else "equal"
            check(err > 100 * LOGITS_TOL,
                  f"{what}: K moved at {where} changes the decode (logits rel err {err:.2e}, tokens {tokens_now})")
        else:
            check(err == 0.0 and got.tokens == base.tokens,
                  f"{what}: K moved at {where} changes nothing (logits rel err {err:.1e})")


def check_window_trim(model, tokens, cache, base, what):
    """Sliding layers cut to their last W rows (what the transfer sends) decode exactly the same."""
    n = cache.num_tokens
    layers = [LayerKv(l.k[-l.window:], l.v[-l.window:], max(0, n - l.window), l.window) if l.window else l
              for l in cache.layers]
    trimmed = KvCache(n, cache.num_kv_heads, cache.head_dim, cache.architecture, layers, cache.first_token,
                      dict(cache.meta))
    got = generate_from_kv(model, tokens, trimmed, len(base.tokens))
    rows = sorted({l.rows for l in layers})
    check(got.tokens == base.tokens and torch.equal(got.logits, base.logits),
          f"{what}: sliding layers trimmed to their last window (rows per layer {rows}) decode the same")


def expect_error(fn, words, what):
    try:
        fn()
    except ValueError as e:
        check(all(w in str(e) for w in words), f"{what}: refused ({e})")
        return
    check(False, f"{what}: accepted")


def check_bad_input(model, other_config, tokens, cache, what):
    wrong = list(tokens)
    wrong[0] = (wrong[0] + 1) % model.config.vocab_size
    expect_error(lambda: generate_from_kv(model, wrong, cache, 2), ["tokens_hash", "different prompt"],
                 f"{what}: another prompt")
    unknown = KvCache(cache.num_tokens, cache.num_kv_heads, cache.head_dim, cache.architecture, cache.layers,
                      None, dict(cache.meta))
    expect_error(lambda: generate_from_kv(model, tokens, unknown, 2), ["first token"], f"{what}: no first token")
    expect_error(lambda: generate_from_kv(model, tokens, cache, 2, first_token=10**6), ["vocabulary"],
                 f"{what}: a first token outside the vocabulary")
    expect_error(lambda: to_dynamic_cache(cache, other_config), ["model"], f"{what}: another model's config")
    sliding = [i for i, l in enumerate(cache.layers) if l.window > 0]
    if sliding and cache.num_tokens >= cache.layers[sliding[0]].window:
        i = sliding[0]
        layers = list(cache.layers)
        keep = layers[i].window - 2  # one row short of the W - 1 transformers keeps
        layers[i] = LayerKv(layers[i].k[-keep:], layers[i].v[-keep:], cache.num_tokens - keep, layers[i].window)
        short = KvCache(cache.num_tokens, cache.num_kv_heads, cache.head_dim, cache.architecture, layers, None, {})
        expect_error(lambda: to_dynamic_cache(short, model.config), [f"layer {i}", "needs the last"],
                     f"{what}: sliding layer {i} holding {keep} rows")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slope")
    ap.add_argument("fixtures")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--families", default="gpt_oss,gpt_oss_mxfp4,llama,qwen3")
    ap.add_argument("--lengths", default="7,33,100")
    ap.add_argument("--meshes", default=",".join(MESHES))
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()  # the tiny gpt-oss config's YaRN note, deprecations
    transformers.logging.disable_progress_bar()
    warnings.simplefilter("ignore")
    families = args.families.split(",")
    models = {f: load_model(os.path.join(args.fixtures, f, "model")) for f in families}
    for family in families:
        model_dir = os.path.join(args.fixtures, family, "model")
        model = models[family]
        other = transformers.AutoConfig.from_pretrained(
            os.path.join(args.fixtures, "llama" if family != "llama" else "gpt_oss", "model"))
        for n in map(int, args.lengths.split(",")):
            tensors, _ = read_safetensors(os.path.join(args.fixtures, family, f"len_{n}.safetensors"))
            tokens = tensors["tokens"].tolist()
            want, want_logits, own = reference(model, tokens, args.new_tokens)
            for mesh in args.meshes.split(","):
                what = f"{family} len {n} {mesh}"
                with tempfile.TemporaryDirectory(prefix="slope-kv-hf-") as work:
                    first, slope_logits, cache = slope_prefill(args, model_dir, tokens, mesh, work)
                cache.first_token = first
                check_layout(to_dynamic_cache(cache, model.config), own, what)
                check(first == want[0], f"{what}: SLOPE's first token {first} is transformers' own {want[0]}")
                err0 = rel_err(slope_logits, want_logits[0])
                check(err0 <= LOGITS_TOL, f"{what}: SLOPE's last-position logits (rel err {err0:.2e})")
                with torch.no_grad():
                    got = generate_from_kv(model, tokens, cache, args.new_tokens)
                check(got.tokens == want, f"{what}: {len(got.tokens)} tokens equal transformers' own generate"
                                          + ("" if got.tokens == want else f" (got {got.tokens}, want {want})"))
                err = logits_err(got.logits, want_logits[1:])
                check(err <= LOGITS_TOL, f"{what}: logits of steps 1..{args.new_tokens - 1} (rel err {err:.2e})")
                if mesh == PERTURB_MESH or (PERTURB_MESH not in args.meshes and mesh == args.meshes.split(",")[0]):
                    with torch.no_grad():
                        check_kv_is_used(model, tokens, cache, got, what)
                        if any(l.window for l in cache.layers):
                            check_window_trim(model, tokens, cache, got, what)
                    check_bad_input(model, other, tokens, cache, what)
    if failures:
        print("failed:\n  " + "\n  ".join(failures))
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
