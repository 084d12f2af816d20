#!/usr/bin/env python3
"""The client side of the KV transfer protocol (python/slope_client/transfer.py, docs/kv-format.md
"Transfer protocol, version 1") under atheris, libFuzzer's engine for Python: the input is what a
rank sends (manifest, tensor frames, the release ack, error frames, garbage), written into one
end of a socketpair and closed; the client's receiving code reads the other end, as pull() and
PushReceiver do for each rank (transfer._receive_shard), and assembles the KvCache
(transfer.assemble). The first byte's bit 0 turns checksum verification on.

Every failure must be a KvTransferError, the client's documented error: any other exception (a
KeyError on a field the manifest lacks, numpy's ValueError on a bad shape, ...) is a finding,
and so is a cache whose own check() fails.

  fuzz/fuzz_kv_client.py [libFuzzer flags] CORPUS_DIR...   (scripts/fuzz.sh runs it)
  fuzz/fuzz_kv_client.py FILE                              (reproduces one input)
"""
import os
import socket
import sys

import atheris
import numpy  # noqa: F401 - imported first, so that only the client's own code is instrumented

with atheris.instrument_imports():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from slope_client import transfer


def test_one_input(data: bytes) -> None:
    if not data:
        return
    verify = bool(data[0] & 1)
    rank, client = socket.socketpair()
    with rank, client:
        rank.sendall(data[1:])  # the socket buffer holds a fuzz input whole
        rank.shutdown(socket.SHUT_WR)
        client.settimeout(5)
        try:
            shard = transfer._receive_shard(client, verify)
            cache = transfer.assemble([shard])
        except transfer.KvTransferError:
            return
        cache.check()


def main():
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
