"""The bytes a KV pull moves with and without window_trim (docs/kv-format.md, "Measured").

  python scripts/kv_trim_bytes.py HANDLE_JSON_LINE_FILE [--api-key KEY]

Reads the handle that `slope run --kv-serve` printed (or a /v1/prefill response's "kv") and, from
every owner rank: first a trimmed transfer that is read to the end but not acked (so the ranks
keep their shards), then a full `slope_client.pull(..., window_trim=False)`, which acks. Prints
one JSON line: the tensor bytes received each way and their ratio. Byte counts, not timings.
"""
import argparse
import json
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from slope_client import pull  # noqa: E402
from slope_client import transfer as t  # noqa: E402


def trimmed_bytes_without_ack(handle, api_key):
    total = 0
    for rank in handle["ranks"]:
        if not rank.get("owner", True):
            continue
        host, _, port = rank["endpoint"].rpartition(":")
        with socket.create_connection((host, int(port)), timeout=600) as s:
            hello = {"kv_id": handle["id"], "dtype": "f32", "window_trim": True}
            if api_key:
                hello["api_key"] = api_key
            t._send_json(s, t.HELLO, hello)
            manifest = t._read_json(s, t.MANIFEST)
            for entry in manifest["tensors"]:
                ftype, length = t._read_header(s)
                assert ftype == t.TENSOR and length == entry["bytes"], entry["name"]
                t._recv_exact(s, length)
                total += length
        # closed without an ack: the rank keeps its shard
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("handle")
    ap.add_argument("--api-key")
    args = ap.parse_args()
    with open(args.handle) as f:
        handle = next(json.loads(line) for line in f if line.startswith("{") and '"endpoint"' in line)
    trimmed = trimmed_bytes_without_ack(handle, args.api_key)
    cache = pull(handle, api_key=args.api_key, window_trim=False, verify=False, timeout=600)
    full = sum(layer.k.nbytes + layer.v.nbytes for layer in cache.layers)
    print(json.dumps({"num_tokens": handle["num_tokens"], "ranks": len(handle["ranks"]), "bytes_trimmed": trimmed,
                      "bytes_full": full, "ratio": trimmed / full}))


if __name__ == "__main__":
    main()
