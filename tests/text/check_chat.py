#!/usr/bin/env python3
"""SLOPE's chat formats (src/slope/text/chat.cpp, `slope tokenize --chat`) against the chat
templates under chat_templates/ rendered by the pinned PyPI `jinja2`, as transformers renders
them (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks); then the ids SLOPE gives for
the rendered text against PyPI `tokenizers`' encoding of jinja2's text (no post-processor: the
text carries its own BOS) with the matching test tokenizer.

usage: check_chat.py SLOPE_BINARY
"""
import json
import os
import subprocess
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
FORMATS = {"harmony": "gpt_oss", "llama3": "llama3", "chatml": "qwen2"}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello, how can I help?"}, {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "line one\nline two\n\n  indented\tand tabbed  \n"}],
    [{"role": "user", "content": "  \u00a0 padded with spaces and NBSP \u3000\n"}],
    [{"role": "user", "content": "\u4f60\u597d\uff0c\u4e16\u754c \u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947 "
                                 "\U0001F469\u200d\U0001F4BB e\u0301 \U0001F600"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "special strings in text: <|eot_id|> <|im_end|> <|end|>"}],
    [],
]


def render_jinja(env, fmt, messages, add_generation_prompt, date):
    with open(os.path.join(HERE, "chat_templates", fmt + ".jinja"), encoding="utf-8") as f:
        template = env.from_string(f.read())
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token="<|begin_of_text|>",
                           date=date, reasoning_effort="medium")


def slope_chat(binary, fmt, messages, extra):
    tok_dir = os.path.join(HERE, "tokenizers", FORMATS[fmt])
    r = subprocess.run([binary, "tokenize", "--model", tok_dir, "--chat", fmt] + extra, input=json.dumps(messages).encode(),
                       capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"slope tokenize --chat {fmt} {extra} failed: {r.stderr.decode()}")
    return r.stdout.decode("utf-8")


def main():
    binary = sys.argv[1]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise TemplateError(message)
    env.globals["raise_exception"] = raise_exception
    failures, checked = 0, 0
    for fmt, family in FORMATS.items():
        tok = Tokenizer.from_file(os.path.join(HERE, "tokenizers", family, "tokenizer.json"))
        for i, messages in enumerate(CONVERSATIONS):
            for gen in (True, False):
                for date in ([None, "2025-06-28"] if fmt == "harmony" else [None]):
                    want = render_jinja(env, fmt, messages, gen, date)
                    extra = ([] if gen else ["--no-generation-prompt"]) + (["--date", date] if date else [])
                    got = slope_chat(binary, fmt, messages, extra + ["--render"])
                    ids = [int(x) for x in slope_chat(binary, fmt, messages, extra).split()]
                    want_ids = tok.encode(want, add_special_tokens=False).ids
                    checked += 1
                    if got != want:
                        failures += 1
                        print(f"{fmt} conversation {i} gen={gen} date={date}: text differs\n  slope:  {got!r}\n  jinja2: {want!r}")
                    elif ids != want_ids:
                        failures += 1
                        print(f"{fmt} conversation {i} gen={gen}: ids differ\n  slope:      {ids}\n  tokenizers: {want_ids}")
    print(f"{checked} renderings checked, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
