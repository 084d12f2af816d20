#!/usr/bin/env python3
"""Writes a placeholder Llama-style tokenizer into a random-weight HF model directory.

SLOPE's `make-model` checkpoints have weights and config.json but no tokenizer, and
llama.cpp's convert_hf_to_gguf.py refuses to write a GGUF without a vocabulary. This
helper writes the smallest honest stand-in, used only by scripts/bench_peer.sh:

  * tokenizer.json: a SentencePiece-style BPE (byte_fallback, "▁" for spaces, no merges)
    with exactly `vocab_size` entries: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>
    (llama.cpp's SPM vocabulary needs them, e.g. for the newline token), the space piece
    "▁", then filler pieces ("a".."z", "aa"..) until the config's vocab_size is reached;
  * tokenizer_config.json and special_tokens_map.json naming <s>/</s>/<unk>.

The vocabulary has no meaning: prefill benchmarks feed token ids, never text, so only
its size matters (it sets the embedding and output-layer shapes, which come from the
checkpoint anyway). The converter takes this tokenizer through its "llama HF" path
(gguf.LlamaHfVocab), and the GGUF records tokenizer model "llama" with pre "default".

Usage: make_dummy_tokenizer.py MODEL_DIR [--out DIR] [--force]
Needs the `tokenizers` package (and `transformers` for the self-check).
"""
from __future__ import annotations

import argparse
import itertools
import json
import string
import sys
from pathlib import Path

SPECIALS = ["<unk>", "<s>", "</s>"]


def filler_pieces():
    letters = string.ascii_lowercase
    for n in itertools.count(1):
        for t in itertools.product(letters, repeat=n):
            yield "".join(t)


def build_vocab(vocab_size: int) -> dict[str, int]:
    base = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + ["▁"]
    if vocab_size < len(base):
        sys.exit(f"vocab_size {vocab_size} is below the {len(base)} special, byte and space tokens")
    vocab = {tok: i for i, tok in enumerate(base)}
    gen = filler_pieces()
    while len(vocab) < vocab_size:
        vocab.setdefault(next(gen), len(vocab))
    return vocab


def build_tokenizer(vocab: dict[str, int]):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="HF model directory holding config.json")
    ap.add_argument("--out", type=Path, help="where to write the tokenizer files (default: model_dir)")
    ap.add_argument("--force", action="store_true", help="overwrite existing tokenizer files")
    a = ap.parse_args()

    cfg = json.loads((a.model_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    vocab_size = int(cfg["vocab_size"])
    out = a.out or a.model_dir
    out.mkdir(parents=True, exist_ok=True)
    if (out / "tokenizer.json").exists() and not a.force:
        print(f"{out}/tokenizer.json exists; leaving it (use --force to replace)")
        return 0

    tok = build_tokenizer(build_vocab(vocab_size))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False,
        "model_max_length": int(cfg.get("max_position_embeddings", 131072)),
        "clean_up_tokenization_spaces": False,
        "comment": "placeholder vocabulary written by SLOPE scripts/make_dummy_tokenizer.py for benchmarks",
    }, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2) + "\n")

    # Self-check: transformers loads it as a fast tokenizer of the right size, and text round-trips.
    try:
        from transformers import AutoTokenizer
    except ImportError:
        print(f"wrote placeholder tokenizer ({vocab_size} tokens) to {out} (transformers absent: not checked)")
        return 0
    t = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert t.is_fast and len(t) == vocab_size, (t.is_fast, len(t), vocab_size)
    ids = t("hello world\n", add_special_tokens=False)["input_ids"]
    assert max(ids) < vocab_size and t.decode(ids) == "hello world\n", (ids, t.decode(ids))
    print(f"wrote placeholder tokenizer ({vocab_size} tokens, {len(ids)} ids for 'hello world\\n') to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
