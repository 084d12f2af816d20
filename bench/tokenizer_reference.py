#!/usr/bin/env python3
"""Single-thread encode speed of PyPI `tokenizers` (and tiktoken's o200k_base when its file is
available offline) on a text file, to compare with bench_tokenizer. Every figure includes the
Python call overhead, stated on its own line (an empty-string encode).

usage: RAYON_NUM_THREADS=1 python bench/tokenizer_reference.py TOKENIZER_JSON TEXT_FILE
"""
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402


def main():
    path, corpus = sys.argv[1], sys.argv[2]
    text = open(corpus, encoding="utf-8", newline="").read()
    mb = len(text.encode()) / 1e6
    lines = text.split("\n")
    tok = Tokenizer.from_file(path)
    t0 = time.perf_counter()
    for _ in range(10000):
        tok.encode("", add_special_tokens=False)
    print(f"tokenizers call overhead: {(time.perf_counter() - t0) / 10000 * 1e6:.1f} us per encode call")
    for name in ("first", "again"):
        t0 = time.perf_counter()
        n = len(tok.encode(text, add_special_tokens=False).ids)
        whole = time.perf_counter() - t0
        t0 = time.perf_counter()
        nl = sum(len(tok.encode(l, add_special_tokens=False).ids) for l in lines)
        per_line = time.perf_counter() - t0
        print(f"tokenizers ({name}): whole text {mb:.1f} MB, {n} tokens: {whole:.3f} s, {mb / whole:.2f} MB/s, "
              f"{n / whole / 1e6:.2f}M tokens/s | {len(lines)} lines: {per_line:.3f} s, {mb / per_line:.2f} MB/s")
    counted, k = 0, 0
    while counted < 100000 and k < len(lines):  # the first lines holding 100K tokens, as bench_tokenizer
        counted += len(tok.encode(lines[k], add_special_tokens=False).ids) + 1
        k += 1
    prompt = "\n".join(lines[:k]) + ("\n" if k < len(lines) else "")
    fresh = Tokenizer.from_file(path)
    t0 = time.perf_counter()
    np_ = len(fresh.encode(prompt).ids)
    print(f"tokenizers prompt of {np_} tokens: {(time.perf_counter() - t0) * 1e3:.1f} ms with an empty cache")
    try:
        import tiktoken
        enc = tiktoken.get_encoding("o200k_base")
    except Exception as e:  # noqa: BLE001 - any failure means "not available offline"
        print(f"tiktoken o200k_base: not available offline ({type(e).__name__}: {str(e)[:120]})")
        return
    t0 = time.perf_counter()
    n = len(enc.encode(text, disallowed_special=()))
    dt = time.perf_counter() - t0
    print(f"tiktoken o200k_base: whole text {n} tokens: {dt:.3f} s, {mb / dt:.2f} MB/s, {n / dt / 1e6:.2f}M tokens/s")


if __name__ == "__main__":
    main()
