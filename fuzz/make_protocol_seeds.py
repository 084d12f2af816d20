#!/usr/bin/env python3
"""Writes the seed inputs of the serving fuzz targets: fuzz_http_bodies (a mode byte, then a
request body), fuzz_kvx_service (a byte picking the service, then what a client sends) and
fuzz_kv_client.py (a byte of options, then what a rank sends: manifest, tensor frames, the ack,
or an error frame), each well-formed as docs/serving.md and docs/kv-format.md describe them.
Rerun only to change the seeds: fuzz/make_protocol_seeds.py fuzz/corpus
"""
import json
import os
import struct
import sys
import zlib

HELLO, MANIFEST, TENSOR, ACK, ERROR, PUSH, DONE = 1, 2, 3, 4, 5, 6, 7


def frame(ftype, payload, version=1):
    if isinstance(payload, dict):
        payload = json.dumps(payload).encode()
    return struct.pack("<4sHBBQ", b"SKVT", version, ftype, 0, len(payload)) + payload


def http_bodies():
    completions, prefill, push = 0, 1, 2
    tok = 4
    ranks = lambda n: (n - 1) << 3  # noqa: E731
    return {
        "completions_ids": (completions, {"model": "tiny", "prompt": [1, 2, 3, 4], "max_tokens": 16, "logprobs": 5,
                                          "temperature": 0.7, "top_p": 1, "n": 1, "stream": False, "stop": ["\n"],
                                          "user": "u", "seed": 7, "logit_bias": {}, "echo": False,
                                          "presence_penalty": 0, "frequency_penalty": 0}),
        "completions_text": (completions | tok, {"prompt": "The quick brown fox", "ttft_slo_ms": 250.5, "priority": -3,
                                                 "best_effort": True, "return_logits": True, "suffix": None}),
        "completions_text_list": (completions | tok, {"prompt": ["Hello world"], "logprobs": None}),
        "completions_text_no_tokenizer": (completions, {"prompt": "no tokenizer here"}),
        "prefill_ids": (prefill, {"prompt": [5, 6, 7], "kv_lease_s": 5, "kv_dtype": "bf16", "logprobs": 0}),
        "prefill_text": (prefill | tok, {"model": "tiny", "prompt": "def main():\n    print(1)", "kv_dtype": "f32",
                                         "ttft_slo_ms": 1000, "return_logits": False}),
        "push_one": (push, {"targets": [{"rank": 0, "endpoint": "127.0.0.1:9000"}]}),
        "push_two": (push | ranks(2), {"targets": [{"rank": 0, "endpoint": "10.0.0.2:9000"},
                                                  {"rank": 1, "endpoint": "[::1]:9001"}],
                                       "dtype": "bf16", "window_trim": False}),
        "push_four": (push | tok | ranks(4), {"targets": [{"rank": r, "endpoint": f"node{r}:70{r}0"} for r in range(4)],
                                              "window_trim": True}),
    }


def kvx_service():
    ack = frame(ACK, {"ok": True})
    return {
        "pull": b"\0" + frame(HELLO, {"kv_id": "a"}) + ack,
        "pull_bf16_untrimmed": b"\0" + frame(HELLO, {"kv_id": "a", "dtype": "bf16", "window_trim": False}) + ack,
        "pull_keyed": b"\1" + frame(HELLO, {"kv_id": "a", "api_key": "fuzz-key", "dtype": "f32"}) + ack,
        "pull_wrong_key": b"\1" + frame(HELLO, {"kv_id": "a", "api_key": "wrong"}),
        "pull_unknown": b"\0" + frame(HELLO, {"kv_id": "b"}),
        "pull_then_error": b"\0" + frame(HELLO, {"kv_id": "a"}) + frame(ERROR, {"error": "checksum", "code": "checksum"}),
        "push": b"\0" + frame(PUSH, {"kv_id": "a", "target": "127.0.0.1:1", "dtype": "bf16"}),
        "push_bad_target": b"\0" + frame(PUSH, {"kv_id": "a", "target": "nowhere"}),
        "ack_first": b"\0" + ack,
        "old_version": b"\0" + frame(HELLO, {"kv_id": "a"}, version=2),
        "garbage": b"\0GET / HTTP/1.1\r\n\r\n",
    }


def manifest(dtype="f32", layers=((0, 0, [(0, 4)]),), tokens=4, heads=1, dim=2):
    """A rank's manifest and tensor frames: layers are (layer, window, ranges)."""
    elem = 4 if dtype == "f32" else 2
    entries, tensors, frames = [], [], []
    for layer, window, ranges in layers:
        rows = sum(c for _, c in ranges)
        entries.append({"layer": layer, "window": window, "ranges": [list(r) for r in ranges], "rows": rows})
        for kind in ("k", "v"):
            data = bytes((i * 7 + layer + (kind == "v")) % 251 for i in range(rows * heads * dim * elem))
            tensors.append({"name": f"layers.{layer}.{kind}", "layer": layer, "kind": kind, "shape": [rows, heads, dim],
                            "bytes": len(data), "crc32": format(zlib.crc32(data), "08x")})
            frames.append(frame(TENSOR, data))
    total = sum(t["bytes"] for t in tensors)
    m = {"version": 1, "kv_id": "a", "model": "tiny", "model_hash": "0123456789abcdef", "architecture": "LlamaForCausalLM",
         "dtype": dtype, "window_trim": True, "num_tokens": tokens, "first_token": 7, "rank": 0, "world_size": 1,
         "num_layers": len(layers), "first_layer": 0, "layer_count": len(layers), "num_kv_heads": heads, "kv_head0": 0,
         "kv_heads": heads, "head_dim": dim, "layers": entries, "tensors": tensors, "bytes": total,
         "untrimmed_bytes": total}
    return frame(MANIFEST, m) + b"".join(frames)


def tweaked(change, dtype="f32"):
    """manifest()'s frames with its manifest changed by change(m)."""
    frames = manifest(dtype)
    length = struct.unpack("<Q", frames[8:16])[0]
    m = json.loads(frames[16:16 + length])
    change(m)
    return frame(MANIFEST, m) + frames[16 + length:]


def kv_client():
    released = frame(ACK, {"released": True, "rank": 0, "kv_id": "a"})
    verify, no_verify = b"\1", b"\0"

    def shape(m):  # 32 bytes as [3, 1, 2] f32 (24 bytes): numpy's reshape refused it
        m["tensors"][0]["shape"] = m["tensors"][1]["shape"] = [3, 1, 2]

    def tokens(m):  # the buffers of 2^40 positions were made before any check
        m["num_tokens"] = 1 << 40

    def heads(m):  # KV heads 1..2 of a 1-head model: numpy's slice clipped, then a shape mismatch
        m["kv_head0"] = 1

    def ranges(m):  # ranges of 3 rows for tensors of 4
        m["layers"][0]["ranges"] = [[0, 3]]

    def bool_count(m):  # true is an int to Python
        m["num_layers"] = True
    error_object = frame(ERROR, {"error": "x", "code": "y"})
    return {
        "one_layer": verify + manifest() + released,
        "bf16": verify + manifest("bf16") + released,
        "window_trim": verify + manifest(layers=((0, 2, [(4, 2)]), (1, 0, [(0, 3), (3, 3)])), tokens=6, heads=2)
        + released,
        "no_verify": no_verify + manifest(layers=((0, 0, [(0, 1), (1, 3)]),)) + released,
        "refused": verify + frame(ERROR, {"error": "rank 0 keeps no KV under id 'a'", "code": "unknown_kv"}),
        "error_mid_way": verify + manifest()[:16 + struct.unpack("<Q", manifest()[8:16])[0]] + error_object,
        "not_released": verify + manifest() + frame(ACK, {"released": False}),
        "regress-shape-mismatch": no_verify + tweaked(shape) + released,
        "regress-huge-num-tokens": no_verify + tweaked(tokens) + released,
        "heads_outside": no_verify + tweaked(heads) + released,
        "ranges_short": no_verify + tweaked(ranges) + released,
        "bool_count": no_verify + tweaked(bool_count) + released,
        "regress-error-frame-list": verify + manifest()[:16 + struct.unpack("<Q", manifest()[8:16])[0]]
        + frame(ERROR, b"[1]"),
    }

def main():
    root = sys.argv[1]
    for name, (mode, body) in http_bodies().items():
        with open(os.path.join(root, "http_bodies", name), "wb") as f:
            f.write(bytes([mode]) + json.dumps(body).encode())
    for target, seeds in (("kvx_service", kvx_service()), ("kv_client", kv_client())):
        for name, data in seeds.items():
            with open(os.path.join(root, target, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
