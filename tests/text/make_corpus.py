#!/usr/bin/env python3
"""Writes the tokenizer test corpus: a deterministic (seeded) text of at least 10 MB.

English and code come from this Python's own standard library sources (docstrings included);
the rest is generated: CJK, Hangul, Arabic with harakat, Devanagari with matras, emoji with ZWJ
sequences, skin tones, flags and keycaps, decomposed letters with combining marks (which NFC
changes), long runs of spaces, tabs, digits and newlines, special-token strings (whole and cut)
inside text, and random Unicode scalar values from every plane (no surrogates, as a Python str
encoded to UTF-8 cannot hold them). Invalid UTF-8 is not in the corpus: `tokenizers` takes a
Python str, which is always valid, and SLOPE rejects invalid bytes (tested separately).

usage: make_corpus.py OUT [--mb 10]
"""
import argparse
import os
import random
import sysconfig
import unicodedata

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<|start|>",
            "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>", "<s>", "</s>",
            "<unk>", "<mask>", "<|reserved_special_token_3|>"]


def stdlib_text(rng, budget):
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, _, names in os.walk(root):
        if "site-packages" in d or "test" in d.split(os.sep):
            continue
        files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    files.sort()
    rng.shuffle(files)
    out, size = [], 0
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        out.append(t)
        size += len(t.encode())
        if size >= budget:
            break
    return "".join(out)


def ranges_text(rng, ranges, marks, n_words, word_len=(1, 6), sep=" "):
    pool = []
    for _ in range(400):  # a vocabulary of words, drawn Zipf-like, so BPE finds merges
        w = []
        for _ in range(rng.randint(*word_len)):
            lo, hi = rng.choice(ranges)
            w.append(chr(rng.randint(lo, hi)))
            if marks and rng.random() < 0.4:
                lo, hi = rng.choice(marks)
                w.append(chr(rng.randint(lo, hi)))
        pool.append("".join(w))
    words = [pool[min(int(rng.paretovariate(1.2)) - 1, len(pool) - 1)] for _ in range(n_words)]
    lines, line = [], []
    for w in words:
        line.append(w)
        if rng.random() < 0.08:
            lines.append(sep.join(line) + rng.choice(["。", "、", "؟", "।", ".", "!", ""]))
            line = []
    return "\n".join(lines) + "\n"


def emoji_text(rng, n):
    people = ["\U0001F468", "\U0001F469", "\U0001F467", "\U0001F466", "\U0001F9D1"]
    tones = ["", "\U0001F3FB", "\U0001F3FC", "\U0001F3FD", "\U0001F3FE", "\U0001F3FF"]
    singles = ["\U0001F600", "\U0001F680", "\u2764\ufe0f", "\U0001F44D", "\U0001F525", "\u2603", "\U0001F9EA"]
    out = []
    for _ in range(n):
        k = rng.random()
        if k < 0.3:
            out.append("\u200d".join(rng.choice(people) + rng.choice(tones) for _ in range(rng.randint(2, 4))))
        elif k < 0.5:
            a, b = rng.randint(0, 25), rng.randint(0, 25)
            out.append(chr(0x1F1E6 + a) + chr(0x1F1E6 + b))
        elif k < 0.6:
            out.append(rng.choice("0123456789#*") + "\ufe0f\u20e3")
        elif k < 0.7:
            out.append("\U0001F3F3\ufe0f\u200d\U0001F308")
        else:
            out.append(rng.choice(singles) + rng.choice(tones[:2]))
        out.append(rng.choice([" ", "", " ok ", "! ", "\n", "tak "]))
    return "".join(out) + "\n"


def combining_text(rng, n):
    base = "aeiouAEIOUnNcCsSzZyY"
    marks = ["\u0301", "\u0300", "\u0302", "\u0308", "\u0303", "\u0327", "\u030c", "\u0323", "\u0328", "\u031b"]
    out = []
    for _ in range(n):
        w = "".join(rng.choice(base) + "".join(rng.sample(marks, rng.randint(0, 3))) for _ in range(rng.randint(1, 8)))
        out.append(w)
        if rng.random() < 0.1:  # Hangul jamo that NFC composes, and precomposed text decomposed
            out.append("\u1100\u1161\u11a8" + unicodedata.normalize("NFD", "Ångström café naïve Øre"))
        out.append("\n" if rng.random() < 0.05 else " ")
    return "".join(out) + "\n"


def runs_text(rng, n):
    out = []
    for _ in range(n):
        k = rng.randrange(8)
        m = int(rng.paretovariate(0.8)) % 3000 + 1
        if k == 0: out.append(" " * m)
        elif k == 1: out.append("".join(rng.choice("0123456789") for _ in range(m)))
        elif k == 2: out.append("\n" * min(m, 60))
        elif k == 3: out.append("\t" * min(m, 200) + "x")
        elif k == 4: out.append("\r\n" * min(m, 30))
        elif k == 5: out.append(" \u00a0\u3000\u2009" * min(m, 50))
        elif k == 6: out.append("word" + " " * m + "word")
        else: out.append("1,234.56 " * min(m, 20) + "٣٤٥ ½ ⅷ ²")
        out.append(rng.choice(["\n", " ", "a", "."]))
    return "".join(out)


def specials_text(rng, n):
    out = []
    for _ in range(n):
        s = rng.choice(SPECIALS)
        k = rng.random()
        if k < 0.15:
            s = s[: rng.randint(1, len(s) - 1)]  # a cut token is plain text
        elif k < 0.3:
            s = " " * rng.randint(1, 3) + s + " " * rng.randint(0, 3)
        elif k < 0.4:
            s = s + s
        out.append(rng.choice(["Hello", "x", "", " the ", "hello", "\n", "é", "123"]) + s)
        out.append(rng.choice([" world", "", "\n", " hello ", "Hello"]))
    return "".join(out) + "\n"


def random_unicode_text(rng, n):
    out = []
    for _ in range(n):
        plane = rng.randrange(17)
        while True:
            cp = plane * 0x10000 + rng.randrange(0x10000)
            if not 0xD800 <= cp <= 0xDFFF:
                break
        out.append(chr(cp))
        r = rng.random()
        if r < 0.1: out.append(" ")
        elif r < 0.12: out.append("\n")
        elif r < 0.15: out.append(chr(rng.randrange(0x20, 0x7F)))
    out.append("\x00\x01\x7f\u0085\u2028\u2029\ufeff\ufffd\uffff\U0010ffff\u180e\u200b\n")
    return "".join(out) + "\n"


def make(mb):
    rng = random.Random(12)
    target = int(mb * 1_000_000)
    parts = []
    parts.append(stdlib_text(rng, target // 2))
    parts.append(ranges_text(rng, [(0x4E00, 0x9FFF), (0x3041, 0x3096), (0x30A1, 0x30FA)], [], 150_000, (1, 3), ""))
    parts.append(ranges_text(rng, [(0xAC00, 0xD7A3)], [], 60_000, (1, 4)))
    parts.append(ranges_text(rng, [(0x0621, 0x064A)], [(0x064B, 0x0652)], 80_000, (2, 7)))
    parts.append(ranges_text(rng, [(0x0905, 0x0939)], [(0x093E, 0x094D), (0x0901, 0x0903)], 80_000, (2, 6)))
    parts.append(emoji_text(rng, 40_000))
    parts.append(combining_text(rng, 40_000))
    parts.append(runs_text(rng, 4_000))
    parts.append(specials_text(rng, 30_000))
    parts.append(random_unicode_text(rng, 150_000))
    rng.shuffle(parts[1:])  # the English/code half first; the rest interleaved by section
    text = "".join(parts)
    while len(text.encode()) < target:  # top up with more mixed sections
        text += ranges_text(rng, [(0x4E00, 0x9FFF)], [], 20_000, (1, 3), "") + specials_text(rng, 5_000)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=10)
    a = ap.parse_args()
    text = make(a.mb)
    with open(a.out, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    print(f"wrote {a.out}: {len(text.encode()) / 1e6:.1f} MB, {text.count(chr(10))} lines")


if __name__ == "__main__":
    main()
