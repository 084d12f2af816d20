#!/usr/bin/env python3
"""Builds the test tokenizer.json files with PyPI `tokenizers` itself, one per model family,
configured as that family's published tokenizer.json is (normalizer, pre-tokenizer regex,
decoder, special tokens, post-processor) and trained on the test corpus to a few thousand
tokens. The files are committed under tests/text/tokenizers/<family>/tokenizer.json; rerun this
only to change them (the ids the test compares come from `tokenizers` at test time anyway).

  llama3  byte-level BPE, Llama-3's Split regex, ignore_merges, <|begin_of_text|> BOS template
  qwen2   NFC, Qwen2's Split regex, ByteLevel post-processor, <|im_start|> etc.
  gpt_oss o200k-style Split regex, harmony special tokens (<|start|>, <|channel|>, ...)
  llama2  SentencePiece-style BPE: Prepend/Replace normalizers, byte fallback, unk, <s> BOS,
          decoder Replace + ByteFallback + Fuse + Strip
  options the remaining options: Metaspace pre-tokenizer (prepend_scheme first) after Digits,
          a regex Replace normalizer, merges written as "a b" strings, added tokens with
          single_word, lstrip, rstrip and normalized set

usage: make_tokenizers.py CORPUS OUTDIR
"""
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TRAIN_BYTES = 3_000_000


def training_lines(corpus):
    with open(corpus, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    # Every other line from the whole corpus, up to the budget, so each section is represented.
    out, size = [], 0
    for line in lines[::2]:
        out.append(line)
        size += len(line)
        if size > TRAIN_BYTES:
            break
    return out


def byte_level(pattern, lines, vocab, specials, ignore_merges):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, tr)
    tok.add_special_tokens(specials)
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = ignore_merges
    return j


def llama3(lines):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_2|>", "<|eot_id|>"]
    specials += [f"<|reserved_special_token_{i}|>" for i in range(3, 20)]
    tok = Tokenizer.from_str(json.dumps(byte_level(LLAMA3, lines, 6000, specials, True)))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def qwen2(lines):
    j = byte_level(QWEN2, lines, 5000, [], False)
    tok = Tokenizer.from_str(json.dumps(j))
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    return tok


def gpt_oss(lines):
    specials = ["<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
                "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
                "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>"]
    tok = Tokenizer.from_str(json.dumps(byte_level(O200K, lines, 7000, specials, True)))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def sentencepiece_bpe(lines, vocab, configure):
    """A SentencePiece-style BPE: <unk> <s> </s>, then the 256 <0xXX> byte tokens, then merges."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    configure(tok)
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=300,
                             show_progress=False)
    tok.train_from_iterator(lines, tr)
    j = json.loads(tok.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab_out = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab_out[f"<0x{b:02X}>"] = len(vocab_out)
    for t, _ in trained:
        if t not in vocab_out:
            vocab_out[t] = len(vocab_out)
    j["model"]["vocab"] = vocab_out
    for a in j["added_tokens"]:
        a["id"] = vocab_out[a["content"]]
    return j


def llama2(lines):
    def configure(tok):
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    j = sentencepiece_bpe(lines, 4000, configure)
    tok = Tokenizer.from_str(json.dumps(j))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", 1)])
    return tok


def options(lines):
    def configure(tok):
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\t+"), "\t")])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)])
    j = sentencepiece_bpe(lines, 3000, configure)
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"] if " " not in "".join(m)]
    tok = Tokenizer.from_str(json.dumps(j))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581", prepend_scheme="first")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("hello", single_word=True, normalized=False),
                    AddedToken("ﬁre", normalized=True),  # NFKC: matches "fire" after normalization
                    AddedToken("<tool_call>", normalized=False, rstrip=True)])
    return tok


def main():
    corpus, outdir = sys.argv[1], sys.argv[2]
    lines = training_lines(corpus)
    for name, build in [("llama3", llama3), ("qwen2", qwen2), ("gpt_oss", gpt_oss), ("llama2", llama2), ("options", options)]:
        tok = build(lines)
        d = os.path.join(outdir, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        print(f"{name}: vocab {tok.get_vocab_size()}, {os.path.getsize(os.path.join(d, 'tokenizer.json')) // 1024} KiB")


if __name__ == "__main__":
    main()
