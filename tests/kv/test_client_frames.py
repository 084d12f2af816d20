#!/usr/bin/env python3
"""The KV pull client's frame parsing (python/slope_client/transfer.py) on what a rank might
send: every input of fuzz/corpus/kv_client (the fuzz target's seeds and the regress-* inputs of
its findings) is written into one end of a socketpair and read by the client, as
fuzz/fuzz_kv_client.py does without atheris. Each must give a KvCache or a KvTransferError, never
another exception; the well-formed seeds must give the values their tensor frames carry.

usage: test_client_frames.py REPO_ROOT   (exit 77 without numpy)
"""
import os
import socket
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("SKIPPED: numpy is not installed (scripts/serve-venv.sh makes a venv with it)")
    sys.exit(77)

root = sys.argv[1]
sys.path.insert(0, os.path.join(root, "python"))
from slope_client import transfer  # noqa: E402

CORPUS = os.path.join(root, "fuzz", "corpus", "kv_client")
WELL_FORMED = {"one_layer": 4, "bf16": 4, "window_trim": 6, "no_verify": 4}


def receive(data: bytes):
    rank, client = socket.socketpair()
    with rank, client:
        rank.sendall(data[1:])
        rank.shutdown(socket.SHUT_WR)
        client.settimeout(5)
        shard = transfer._receive_shard(client, bool(data[0] & 1))
        return shard, transfer.assemble([shard])


def tensor_frames(data: bytes):
    """The payloads of the tensor frames in data (after the options byte), read independently."""
    out, at = [], 1
    while at + 16 <= len(data):
        _, _, ftype, _, length = struct.unpack("<4sHBBQ", data[at:at + 16])
        if ftype == transfer.TENSOR:
            out.append(data[at + 16:at + 16 + length])
        at += 16 + length
    return out


def main():
    failures = []
    names = sorted(os.listdir(CORPUS))
    assert any(n.startswith("regress-") for n in names), "no regress-* inputs in " + CORPUS
    for name in names:
        with open(os.path.join(CORPUS, name), "rb") as f:
            data = f.read()
        try:
            (manifest, tensors), cache = receive(data)
        except transfer.KvTransferError as e:
            if name in WELL_FORMED:
                failures.append(f"{name}: refused: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - exactly what the test looks for
            failures.append(f"{name}: {type(e).__name__}: {e}")
            continue
        cache.check()
        if name in WELL_FORMED:
            if cache.num_tokens != WELL_FORMED[name]:
                failures.append(f"{name}: {cache.num_tokens} tokens, want {WELL_FORMED[name]}")
            for entry, raw in zip(manifest["tensors"], tensor_frames(data)):
                if manifest["dtype"] == "f32":
                    want = np.frombuffer(raw, "<f4")
                else:
                    want = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
                    want = want.view(np.float32)
                if not np.array_equal(tensors[entry["name"]].ravel(), want, equal_nan=True):
                    failures.append(f"{name}: {entry['name']} differs from its frame")
    for f in failures:
        print("FAIL", f)
    print(f"{len(names) - len(failures)}/{len(names)} inputs handled")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
