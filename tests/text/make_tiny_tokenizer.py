#!/usr/bin/env python3
"""Builds tests/text/tokenizers/tiny_llama3/tokenizer.json with PyPI `tokenizers`: configured as
Llama-3's tokenizer.json is (make_tokenizers.py's llama3: Split regex, byte-level BPE,
ignore_merges, <|begin_of_text|> BOS template) but trained to 480 tokens on the short text
below, so that with its 5 special tokens every id is below 512, the vocabulary of the tiny test
models under tests/reference/fixtures. The `slope run --prompt` tests put it next to a copy of
such a model. Rerun only to change the file.

usage: make_tiny_tokenizer.py OUTDIR
"""
import json
import os
import sys

from tokenizers import Tokenizer, processors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizers import LLAMA3, byte_level  # noqa: E402

TEXT = """The quick brown fox jumps over the lazy dog. A prefill engine reads the whole prompt at once
and returns the first token with the key and value cache of every layer.
def main():
    for i in range(10):
        print("hello world", i)
Long prompts are split over ranks; each rank computes its share of the attention.
The tokenizer turns text into ids, and the model turns ids into a distribution over the next token.
"""


def main():
    lines = TEXT.split("\n") * 20
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = Tokenizer.from_str(json.dumps(byte_level(LLAMA3, lines, 480, specials, True)))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    assert tok.get_vocab_size() <= 512, tok.get_vocab_size()
    d = os.path.join(sys.argv[1], "tiny_llama3")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    print(f"tiny_llama3: vocab {tok.get_vocab_size()}, BOS {bos}")


if __name__ == "__main__":
    main()
