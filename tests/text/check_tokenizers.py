#!/usr/bin/env python3
"""SLOPE's tokenizer against PyPI `tokenizers`, per family under tests/text/tokenizers/.

For the generated corpus (make_corpus.py, 10 MB) it checks that `slope tokenize` gives the ids
`tokenizers` gives for every line and for the whole corpus as one text; that decoding those ids
gives `tokenizers`' text (with and without special tokens), so SLOPE round-trips every line
`tokenizers` round-trips; and that random id sequences (cut UTF-8, stray byte tokens) decode to
the same text. Exits 1 with the first differences.

usage: check_tokenizers.py SLOPE_BINARY [--families a,b] [--mb 10]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_corpus  # noqa: E402


def slope(binary, model, args, data):
    r = subprocess.run([binary, "tokenize", "--model", model] + args, input=data, capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"slope tokenize {' '.join(args)} failed ({r.returncode}): {r.stderr.decode()[:2000]}")
    return r.stdout.decode("utf-8")


def parse_ids(out):
    return [[int(x) for x in line.split()] for line in out.split("\n")[:-1]]


def show(s, n=160):
    return repr(s if len(s) <= n else s[:n] + "...")


def first_difference(a, b):
    return next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))


def check_family(binary, name, text, lines, failures):
    model = os.path.join(HERE, "tokenizers", name)
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    t0 = time.time()
    ref = [e.ids for e in tok.encode_batch(lines, add_special_tokens=True)]
    got = parse_ids(slope(binary, model, ["--lines"], text.encode()))
    bad = [i for i in range(len(lines)) if i >= len(got) or got[i] != ref[i]]
    if len(got) != len(lines):
        failures.append(f"{name}: slope gave {len(got)} lines of ids for {len(lines)} lines")
    for i in bad[:5]:
        g = got[i] if i < len(got) else []
        k = first_difference(ref[i], g)
        failures.append(f"{name}: line {i + 1} {show(lines[i])} differs at token {k}:\n"
                        f"  tokenizers {ref[i][max(0, k - 3):k + 8]}\n  slope      {g[max(0, k - 3):k + 8]}")
    whole_ref = tok.encode(text).ids
    whole = parse_ids(slope(binary, model, [], text.encode()))[0]
    if whole != whole_ref:
        k = first_difference(whole_ref, whole)
        failures.append(f"{name}: whole corpus differs at token {k} of {len(whole_ref)}: tokenizers {whole_ref[k:k + 8]} slope {whole[k:k + 8]}")

    # Decoding: exactly tokenizers' text, with and without special tokens.
    ids_text = ("\n".join(" ".join(map(str, ids)) for ids in ref) + "\n").encode()
    round_trips = 0
    for skip in (False, True):
        want = tok.decode_batch(ref, skip_special_tokens=skip)
        out = [json.loads(l) for l in slope(binary, model, ["--decode", "--lines"] + (["--skip-special"] if skip else []), ids_text).split("\n")[:-1]]
        dbad = [i for i in range(len(want)) if i >= len(out) or out[i] != want[i]]
        for i in dbad[:5]:
            failures.append(f"{name}: decode(skip_special={skip}) of line {i + 1} {show(lines[i])}\n  tokenizers {show(want[i])}\n  slope      {show(out[i] if i < len(out) else '')}")
        if skip:
            round_trips = sum(1 for i in range(len(lines)) if want[i] == lines[i])
            lost = [i for i in range(len(lines)) if want[i] == lines[i] and (i >= len(out) or out[i] != lines[i])]
            if lost:
                failures.append(f"{name}: {len(lost)} lines round-trip in tokenizers but not in slope")
    # Random ids: cut characters, stray byte tokens, special tokens anywhere.
    rng = random.Random(7)
    n = tok.get_vocab_size()
    seqs = [[rng.randrange(n) for _ in range(rng.randint(1, 24))] for _ in range(3000)]
    want = tok.decode_batch(seqs, skip_special_tokens=False)
    out = [json.loads(l) for l in slope(binary, model, ["--decode", "--lines"], ("\n".join(" ".join(map(str, s)) for s in seqs) + "\n").encode()).split("\n")[:-1]]
    rbad = [i for i in range(len(seqs)) if i >= len(out) or out[i] != want[i]]
    for i in rbad[:3]:
        failures.append(f"{name}: decode of random ids {seqs[i]}\n  tokenizers {show(want[i])}\n  slope      {show(out[i] if i < len(out) else '')}")
    print(f"{name}: {len(lines)} lines, {len(lines) - len(bad)} ids equal; whole corpus {len(whole_ref)} tokens "
          f"{'equal' if whole == whole_ref else 'DIFFERENT'}; {round_trips} lines round-trip in tokenizers; "
          f"random-id decodes equal {len(seqs) - len(rbad)}/{len(seqs)} ({time.time() - t0:.0f} s)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("slope")
    ap.add_argument("--families", default="llama3,qwen2,gpt_oss,llama2,options")
    ap.add_argument("--mb", type=float, default=10)
    a = ap.parse_args()
    import tokenizers
    text = make_corpus.make(a.mb)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    print(f"tokenizers {tokenizers.__version__}; corpus {len(text.encode()) / 1e6:.1f} MB, {len(lines)} lines", flush=True)
    failures = []
    for name in a.families.split(","):
        check_family(a.slope, name, text, lines, failures)
    if failures:
        print("\n".join(["FAILED:"] + failures[:40]))
        sys.exit(1)
    print("all equal")


if __name__ == "__main__":
    main()
