#!/usr/bin/env python3
"""Writes the seed inputs of fuzz_tokenizer (fuzz/corpus/tokenizer/): a 4-byte little-endian
length, a tokenizer.json, then a text to encode. The tokenizer.json files are the test ones of
tests/text/tokenizers/ (made with PyPI `tokenizers`), each cut down to its first ids and the
merges among them so that a seed is a few KB, and hand-made ones that between them use every
normalizer, pre-tokenizer, decoder and Split behavior tokenizer.cpp implements. Rerun only to
change the seeds: fuzz/make_tokenizer_seeds.py fuzz/corpus/tokenizer
"""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEXT = ("Hello, World! It's 2026: the prefill of 12345 tokens.\n\tTabs\u3000and\u00a0spaces  \u00e9\u0301 "
        "\ufb01 \u2460 caf\u00e9 \u65e5\u672c\u8a9e \U0001F600 <s></s><|begin_of_text|><|im_start|>user\n")


def shrink(family, keep):
    with open(os.path.join(ROOT, "tests/text/tokenizers", family, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < keep}
    merges = []
    for m in j["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    j["model"]["vocab"], j["model"]["merges"] = vocab, merges
    return j


def bpe(vocab_tokens, merges, **model):
    vocab = {t: i for i, t in enumerate(vocab_tokens)}
    return {"type": "BPE", "vocab": vocab, "merges": merges, **model}


def hand_made():
    chars = [chr(c) for c in range(0x20, 0x7f)] + ["\u2581", "\u00e9", "<0x0A>", "<0x09>", "<0xE2>", "<0x96>", "<0x81>"]
    model = bpe(chars + ["he", "ll", "hell", "hello"], [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"]],
                unk_token="?", byte_fallback=True, fuse_unk=True)
    added = [{"id": len(chars) + 4, "content": "<s>", "special": True, "normalized": False, "single_word": False,
              "lstrip": False, "rstrip": False},
             {"id": len(chars) + 5, "content": "[X]", "special": False, "normalized": True, "single_word": True,
              "lstrip": True, "rstrip": True}]
    post = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [len(chars) + 4], "tokens": ["<s>"]}}}
    out = []
    normalizers = [{"type": "NFD"}, {"type": "NFKD"}, {"type": "NFKC"}, {"type": "NFC"},
                   {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                                                        {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "#"}]}]
    pre = [{"type": "Split", "pattern": {"String": " "}, "behavior": b, "invert": inv}
           for b, inv in (("Removed", False), ("MergedWithPrevious", False), ("MergedWithNext", True),
                          ("Contiguous", False), ("Isolated", True))]
    pre += [{"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                   {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                                    "split": False}]},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]
    decoders = [{"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                  {"type": "ByteFallback"}, {"type": "Fuse"},
                                                  {"type": "Strip", "content": " ", "start": 1, "stop": 1}]},
                {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True},
                {"type": "Replace", "pattern": {"Regex": "l+"}, "content": "L"}, {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                None, None]
    for i, p in enumerate(pre):
        out.append({"version": "1.0", "added_tokens": added, "normalizer": normalizers[i % len(normalizers)],
                    "pre_tokenizer": p, "post_processor": post if i % 2 == 0 else None,
                    "decoder": decoders[i % len(decoders)], "model": model})
    return out


def main():
    d = sys.argv[1]
    seeds = {f"{f}_cut": shrink(f, 320) for f in ("llama3", "qwen2", "gpt_oss", "llama2", "options")}
    with open(os.path.join(ROOT, "tests/text/tokenizers/tiny_llama3/tokenizer.json"), encoding="utf-8") as f:
        seeds["tiny_llama3"] = json.load(f)
    for i, j in enumerate(hand_made()):
        seeds[f"kinds_{i}"] = j
    for name, j in seeds.items():
        body = json.dumps(j, ensure_ascii=False, separators=(",", ":")).encode()
        with open(os.path.join(d, name), "wb") as f:
            f.write(struct.pack("<I", len(body)) + body + TEXT.encode())


if __name__ == "__main__":
    main()
