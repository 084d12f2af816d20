#!/usr/bin/env python3
"""llama.cpp continues from SLOPE's KV cache: tokens and logits against llama.cpp's own prefill.

For each fixture model (tests/reference/fixtures/<family>/model, converted to f32 GGUF by
scripts/llamacpp-venv.sh), prompt (the fixture's len_<N> tokens) and mesh (1 rank, ring 2,
tp 2 under mpirun), SLOPE prefills with --dtype f32 --kv-out; load_kv_dir assembles the shards;
slope_client.llamacpp writes llama.cpp's sequence state, restored with
llama_state_seq_set_data (and, once per family, from a 'ggsq' file by llama_state_seq_load_file)
into a fresh llama.cpp context, with flash attention off (V transposed) and on.

The reference is llama.cpp alone: the same context prefilling the prompt itself, then greedy.
Pass, per case:
  - SLOPE's first token equals llama.cpp's argmax at the last prompt position;
  - the first decode step (SLOPE's first token at position N) gives logits within RTOL relative
    (max |a - b| / max |b|) of llama.cpp's own, FA_RTOL with flash attention (see FA_RTOL);
  - the next STEPS greedy tokens are llama.cpp's own (also with f16 and bf16 caches, once each);
  - llama.cpp's own state has the writer's framing and cells, and its K and V (from a prefill
    without flash attention) are within KV_RTOL of SLOPE's, so the mapping, not luck, matches.
For gpt-oss SLOPE runs the fixture with YaRN truncated as llama.cpp always does (slope_model);
how far the fixture's own untruncated YaRN is from llama.cpp is printed as a note.
And it can fail: with one layer's KV perturbed the logits must leave the tolerance.

Usage: check_llamacpp.py --slope BIN [--fixtures DIR] [--models DIR] [--families llama,gpt_oss]
       [--lengths 7,33,100] [--meshes 1,ring2,tp2] [--steps 16]
Exit 0 pass, 1 fail, 77 when llama_cpp / the GGUFs are absent (make them with
scripts/llamacpp-venv.sh).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

# f16 / bf16 caches (one case each per family, flash attention off): the writer rounds SLOPE's
# f32 KV, llama.cpp its own; measured 1e-4 .. 3e-4 (f16) and 1e-3 .. 2e-3 (bf16) here.
CACHE_TYPE_RTOL = {"f16": 2e-3, "bf16": 1e-2}
RTOL = 1e-4  # first decode step's logits, f32 GGUF and f32 caches, flash attention off (issue 13)
# With flash attention on, llama.cpp's CPU kernel is not f32-exact: its own prefill with flash
# attention differs from its own without by 3e-4 .. 9e-4 relative in the next logits on these
# models (f16-level), so a state restored into it is held to f16-level agreement.
FA_RTOL = 2e-3
KV_RTOL = 1e-4  # SLOPE's K/V against llama.cpp's own (without flash attention), per layer: max |a-b| / max |b|
MESHES = {"1": (1, []), "ring2": (2, ["--ring", "2"]), "tp2": (2, ["--tp", "2"]),
          # ring 2 with the KV pulled from both ranks over TCP (`slope run --kv-serve`,
          # slope_client.pull; sliding layers sent as their last W rows) instead of read from files
          "ring2-pull": (2, ["--ring", "2"])}

try:
    import llama_cpp
    from kv_serve import pull_after_prefill  # tests/kv, this script's directory
    from slope_client.cache import load_kv_dir, read_safetensors
    from slope_client import llamacpp as lc
except ImportError as e:  # the environment is made by scripts/llamacpp-venv.sh
    print(f"SKIPPED: {e}; run scripts/llamacpp-venv.sh and use its python", file=sys.stderr)
    sys.exit(77)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


class Engine:
    """A llama.cpp context on one GGUF with f32 caches and flash attention on or off."""

    def __init__(self, gguf: str, flash_attn: bool, cache_type: str = "f32"):
        self.llm = llama_cpp.Llama(model_path=gguf, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2,
                                   type_k=lc.GGML_TYPES[cache_type], type_v=lc.GGML_TYPES[cache_type],
                                   flash_attn=flash_attn, logits_all=True, verbose=False)
        want = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if self.llm.context_params.flash_attn_type != want:
            raise RuntimeError(f"llama_cpp.Llama did not set flash attention {flash_attn}")

    def step(self, token: int) -> np.ndarray:
        """Evaluates one token after what the context holds; its logits."""
        self.llm.eval([token])
        return np.array(self.llm.scores[self.llm.n_tokens - 1], dtype=np.float32)

    def prefill(self, tokens) -> np.ndarray:
        self.llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm.ctx), True)
        self.llm.eval(list(tokens))
        return np.array(self.llm.scores[self.llm.n_tokens - 1], dtype=np.float32)

    def greedy(self, first: int, steps: int) -> tuple[np.ndarray, list[int]]:
        """Feeds `first`, then `steps` argmax tokens; the first step's logits and the tokens."""
        logits = self.step(first)
        out, cur = [], logits
        for _ in range(steps):
            out.append(int(np.argmax(cur)))
            cur = self.step(out[-1])
        return logits, out

    def state(self) -> bytes:
        ctx = self.llm.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        got = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
        if got != size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        return bytes(buf)

    def load_file(self, path: str, n: int) -> None:
        self.llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm.ctx), True)
        toks = (llama_cpp.llama_token * n)()
        count = ctypes.c_size_t(0)
        got = llama_cpp.llama_state_seq_load_file(self.llm.ctx, path.encode(), 0, toks, n, ctypes.byref(count))
        if got == 0 or count.value != n:
            raise RuntimeError(f"llama_state_seq_load_file({path}) failed ({got} bytes, {count.value} tokens)")
        self.llm.input_ids[:n] = list(toks)
        self.llm.n_tokens = n


def slope_model(args, family: str, work: str, llama_rope: bool = True) -> str:
    """The checkpoint SLOPE prefills: the fixture, or a view of it with llama.cpp's YaRN.

    llama.cpp always rounds YaRN's correction range to whole dimensions
    (ggml_rope_yarn_corr_dims: floor / ceil), which transformers does only with
    rope_parameters.truncate true. The gpt-oss fixture sets it false, so there the two engines
    run different RoPE frequencies on the same weights. SLOPE then prefills a view of the
    checkpoint (same weights, symlinked) whose config says truncate true: the model llama.cpp runs.
    """
    src = os.path.abspath(os.path.join(args.fixtures, family, "model"))  # the view's symlinks point here
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    rope = config.get("rope_parameters") or {}
    if not llama_rope or rope.get("rope_type") != "yarn" or rope.get("truncate", True):
        return src
    view = os.path.join(work, f"{family}-model-yarn-truncate")
    if not os.path.isdir(view):
        os.makedirs(view)
        for name in os.listdir(src):
            if name != "config.json":
                os.symlink(os.path.join(src, name), os.path.join(view, name))
        for key in ("rope_parameters", "rope_scaling"):
            if isinstance(config.get(key), dict):
                config[key]["truncate"] = True
        with open(os.path.join(view, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    return view


def slope_prefill(args, family: str, tokens: np.ndarray, mesh: str, work: str, llama_rope: bool = True):
    """slope run --dtype f32 on the mesh, with --kv-out, or --kv-serve for a "-pull" mesh; (KvCache,
    SLOPE's first token)."""
    np_, flags = MESHES[mesh]
    d = os.path.join(work, f"{family}-{len(tokens)}-{mesh}-{'llama' if llama_rope else 'hf'}-rope")
    os.makedirs(d, exist_ok=True)
    tok_file = os.path.join(d, "tokens.txt")
    with open(tok_file, "w") as f:
        f.write(" ".join(str(int(t)) for t in tokens))
    kv_dir = os.path.join(d, "kv")
    pulled = mesh.endswith("-pull")
    kv_flags = ["--kv-serve", "--kv-lease-s", "120"] if pulled else ["--kv-out", kv_dir, "--json"]
    cmd = [args.slope, "run", "--model", slope_model(args, family, work, llama_rope), "--tokens", tok_file,
           "--dtype", "f32", *kv_flags, "--quiet", "--threads", "1", *flags]
    if np_ > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), *cmd]
    if pulled:
        cache = pull_after_prefill(cmd)
        return cache, int(cache.first_token)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    line = next(l for l in r.stdout.splitlines() if l.startswith("{"))
    out = json.loads(line)
    first = out["first_token"] if "first_token" in out else out["prompts"][0]["first_token"]
    return load_kv_dir(kv_dir), int(first)


def check_state_layout(own: bytes, exact: bytes, cache, layout, flash_attn: bool) -> float:
    """The writer's state from SLOPE's cache against llama.cpp's own.

    own: llama.cpp's state after its own prefill in the same kind of context (same framing and
    cells required); exact: its state from a prefill without flash attention (f32-exact), whose
    K and V SLOPE's must match within KV_RTOL.
    """
    ours = lc.seq_state_body(cache, layout, flash_attn=flash_attn)
    if len(own) != len(ours):
        raise AssertionError(f"llama.cpp's own state body is {len(own)} bytes, the writer's {len(ours)}")
    a, b, c = (lc.read_seq_state_body(x, layout) for x in (ours, own, exact))
    worst = 0.0
    for sa, sb, sc in zip(a, b, c):
        if not np.array_equal(sa.positions, sb.positions) or sa.v_trans != sb.v_trans:
            raise AssertionError(f"cells {sa.positions.tolist()} (v_trans {sa.v_trans}) vs llama.cpp's "
                                 f"{sb.positions.tolist()} (v_trans {sb.v_trans})")
        for x, y in zip(sa.k + sa.v, sc.k + sc.v):
            worst = max(worst, rel(x, y))
    if worst > KV_RTOL:
        raise AssertionError(f"SLOPE's KV differs from llama.cpp's own by {worst:.2e} relative (> {KV_RTOL})")
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slope", required=True)
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "tests", "reference", "fixtures"))
    ap.add_argument("--models", default=os.path.join(os.environ.get("SLOPE_LLAMACPP_DIR", os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "slope", "llamacpp")), "models"))
    ap.add_argument("--families", default="llama,gpt_oss")
    ap.add_argument("--lengths", default="7,33,100")
    ap.add_argument("--meshes", default="1,ring2,tp2,ring2-pull")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if not shutil.which("mpirun") and args.meshes != "1":
        print("FAIL: mpirun is not on PATH (the ring and tp meshes run under it)", file=sys.stderr)
        return 1

    work = tempfile.mkdtemp(prefix="slope-kv-llamacpp-")
    failures, cases = [], 0
    try:
        for family in args.families.split(","):
            gguf = os.path.join(args.models, f"{family}.f32.gguf")
            if not os.path.exists(gguf):
                print(f"SKIPPED: {gguf} is missing; make it with scripts/llamacpp-venv.sh", file=sys.stderr)
                return 77
            layout = lc.read_gguf_layout(gguf)
            engines = {fa: Engine(gguf, fa) for fa in (False, True)}
            rope = llama_cpp.llama_model_rope_type(engines[False].llm.model)
            want_rope = {"norm": llama_cpp.LLAMA_ROPE_TYPE_NORM, "neox": llama_cpp.LLAMA_ROPE_TYPE_NEOX}[layout.rope]
            if rope != want_rope:
                cases += 1
                failures.append(f"{family}: llama.cpp's rope type {rope}, the writer's table says {layout.rope}")
                continue
            print(f"{family}: {layout}")
            file_checked = False
            for n in (int(x) for x in args.lengths.split(",")):
                tensors, _ = read_safetensors(os.path.join(args.fixtures, family, f"len_{n}.safetensors"))
                tokens = tensors["tokens"].astype(np.int64)
                ref = {}
                for fa, eng in engines.items():  # llama.cpp alone: prefill, then greedy
                    last = eng.prefill(tokens)
                    t0 = int(np.argmax(last))
                    own_state = eng.state()[8:]
                    logits, toks = eng.greedy(t0, args.steps)
                    ref[fa] = (t0, logits, toks, own_state)
                print(f"{family} N={n}: llama.cpp's own prefill with flash attention vs without: next logits "
                      f"{rel(ref[True][1], ref[False][1]):.1e} relative")
                if slope_model(args, family, work) != slope_model(args, family, work, llama_rope=False):
                    # Not a pass criterion: how far the fixture's own RoPE (transformers' YaRN
                    # without truncation) is from llama.cpp's, measured once per prompt.
                    cache, first = slope_prefill(args, family, tokens, "1", work, llama_rope=False)
                    eng = engines[False]
                    lc.restore(eng.llm, cache, tokens, layout=layout)
                    logits, toks = eng.greedy(ref[False][0], args.steps)
                    print(f"note {family} N={n}: with the fixture's YaRN (truncate false) SLOPE's first token "
                          f"{first} vs llama.cpp's {ref[False][0]}, first-step logits "
                          f"{rel(logits, ref[False][1]):.1e} relative, {sum(a != b for a, b in zip(toks, ref[False][2]))}"
                          f"/{args.steps} tokens differ")
                for mesh in args.meshes.split(","):
                    cache, first = slope_prefill(args, family, tokens, mesh, work)
                    for fa, eng in engines.items():
                        cases += 1
                        name = f"{family} N={n} mesh={mesh} fa={int(fa)}"
                        t0, ref_logits, ref_toks, own_state = ref[fa]
                        tol = FA_RTOL if fa else RTOL
                        try:
                            if first != t0:
                                raise AssertionError(f"SLOPE's first token {first}, llama.cpp's {t0}")
                            kv_err = check_state_layout(own_state, ref[False][3], cache, layout, fa)
                            lc.restore(eng.llm, cache, tokens, layout=layout)
                            logits, toks = eng.greedy(first, args.steps)
                            err = rel(logits, ref_logits)
                            if err > tol:
                                raise AssertionError(f"first decode step's logits {err:.2e} relative from "
                                                     f"llama.cpp's own (> {tol})")
                            if toks != ref_toks:
                                raise AssertionError(f"tokens {toks}, llama.cpp's own {ref_toks}")
                            msg = f"kv {kv_err:.1e}, logits {err:.1e}"
                            if any(layer.window for layer in cache.layers):
                                # what a window-trimmed pull hands over: SWA layers hold only their last W
                                lc.restore(eng.llm, window_trimmed(cache), tokens, layout=layout)
                                tlog, ttoks = eng.greedy(first, args.steps)
                                if rel(tlog, ref_logits) > tol or ttoks != ref_toks:
                                    raise AssertionError(f"from the window-trimmed cache: logits "
                                                         f"{rel(tlog, ref_logits):.2e}, tokens {ttoks} vs {ref_toks}")
                                msg += ", trimmed ok"
                            if not file_checked:  # the 'ggsq' file through llama_state_seq_load_file
                                path = os.path.join(work, f"{family}-{n}.ggsq")
                                lc.write_seq_state_file(path, cache, tokens, layout, flash_attn=fa)
                                eng.load_file(path, len(tokens))
                                flog, ftoks = eng.greedy(first, args.steps)
                                if rel(flog, ref_logits) > tol or ftoks != ref_toks:
                                    raise AssertionError(f"from the 'ggsq' file: logits {rel(flog, ref_logits):.2e}, "
                                                         f"tokens {ftoks} vs {ref_toks}")
                                msg += ", ggsq file ok"
                                file_checked = True
                            # It can fail: one layer's KV perturbed must move the logits out of tolerance.
                            bad = perturbed(cache, layer=len(cache.layers) - 1)
                            lc.restore(eng.llm, bad, tokens, layout=layout)
                            blog, btoks = eng.greedy(first, args.steps)
                            berr = rel(blog, ref_logits)
                            if berr <= tol:
                                raise AssertionError(f"with the last layer's KV perturbed the logits are still "
                                                     f"within {tol} ({berr:.2e}): the restored KV is not used")
                            msg += f"; perturbed: logits {berr:.1e}, tokens {'differ' if btoks != ref_toks else 'same'}"
                            print(f"ok   {name}: {msg}")
                        except (AssertionError, RuntimeError, ValueError) as e:
                            failures.append(f"{name}: {e}")
                            print(f"FAIL {name}: {e}")
            # Reduced-precision caches: the writer's f16 / bf16 encoding, on the last prompt.
            cache, first = slope_prefill(args, family, tokens, "1", work)
            for cache_type, tol in CACHE_TYPE_RTOL.items():
                cases += 1
                name = f"{family} N={len(tokens)} mesh=1 fa=0 cache={cache_type}"
                eng = Engine(gguf, False, cache_type)
                t0 = int(np.argmax(eng.prefill(tokens)))
                ref_logits, ref_toks = eng.greedy(t0, args.steps)
                lc.restore(eng.llm, cache, tokens, layout=layout)
                logits, toks = eng.greedy(first, args.steps)
                err = rel(logits, ref_logits)
                if first != t0 or err > tol or toks != ref_toks:
                    failures.append(f"{name}: first token {first} vs {t0}, logits {err:.2e} (> {tol}?), "
                                    f"tokens {toks} vs {ref_toks}")
                    print(f"FAIL {failures[-1]}")
                else:
                    print(f"ok   {name}: logits {err:.1e}")
    finally:
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{cases - len(failures)}/{cases} cases passed")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


def window_trimmed(cache):
    """A copy of the cache whose sliding-window layers keep only their last `window` rows."""
    import copy

    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        lo = max(layer.first_position, cache.num_tokens - layer.window) if layer.window else 0
        cut = lo - layer.first_position  # rows already dropped (a pulled cache is trimmed)
        out.layers.append(type(layer)(layer.k[cut:], layer.v[cut:], lo, layer.window))
    out.check()
    return out


def perturbed(cache, layer: int):
    """A copy of the cache with one layer's K and V replaced by noise of the same scale."""
    import copy

    bad = copy.copy(cache)
    bad.layers = list(cache.layers)
    src = cache.layers[layer]
    rng = np.random.default_rng(layer)
    k = rng.standard_normal(src.k.shape).astype(np.float32) * float(np.std(src.k))
    v = rng.standard_normal(src.v.shape).astype(np.float32) * float(np.std(src.v))
    bad.layers[layer] = type(src)(k, v, src.first_position, src.window)
    return bad


if __name__ == "__main__":
    sys.exit(main())
