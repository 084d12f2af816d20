"""Pulling a prefill's KV cache from SLOPE's ranks over TCP (docs/kv-format.md, "Transfer
protocol, version 1"), and receiving it in push mode.

`pull(handle)` takes the `kv` object of a `/v1/prefill` response (or the line `slope run
--kv-serve` prints), dials every rank that owns a shard at once (a thread per rank), checks each
tensor's checksum, acks (the rank then releases its shard) and assembles one `KvCache`.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import zlib

import numpy as np

from .cache import KvCache, LayerKv

PROTOCOL_VERSION = 1
_MAGIC = b"SKVT"
_HEADER = struct.Struct("<4sHBBQ")  # magic, version, type, zero, payload length
HELLO, MANIFEST, TENSOR, ACK, ERROR, PUSH, DONE = 1, 2, 3, 4, 5, 6, 7
_NAMES = {HELLO: "hello", MANIFEST: "manifest", TENSOR: "tensor", ACK: "ack", ERROR: "error", PUSH: "push", DONE: "done"}
_MAX_JSON = 16 << 20
_FIRST_BUFFER = 64 << 20


class KvTransferError(RuntimeError):
    """A pull or push failed: the rank, and what went wrong (the rank's own message when it refused)."""


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    """n bytes; the buffer grows (doubling from 64 MiB) as they arrive, so that a length the
    peer made up costs no more memory than the bytes it really sent."""
    buf = bytearray(min(n, _FIRST_BUFFER))
    got = 0
    try:
        while got < n:
            if got == len(buf):
                buf.extend(bytes(min(len(buf), n - len(buf))))
            r = sock.recv_into(memoryview(buf)[got:], len(buf) - got)
            if r == 0:
                raise KvTransferError("the connection ended in the middle of a frame")
            got += r
    except OSError as e:  # a timeout (socket.timeout is an OSError), a reset
        raise KvTransferError(f"receiving from the rank failed: {e}") from e
    return buf


def _send_frame(sock: socket.socket, ftype: int, payload: bytes) -> None:
    try:
        sock.sendall(_HEADER.pack(_MAGIC, PROTOCOL_VERSION, ftype, 0, len(payload)) + payload)
    except OSError as e:
        raise KvTransferError(f"sending to the rank failed: {e}") from e


def _send_json(sock: socket.socket, ftype: int, obj: dict) -> None:
    _send_frame(sock, ftype, json.dumps(obj).encode())


def _read_header(sock: socket.socket) -> tuple[int, int]:
    magic, version, ftype, zero, length = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if magic != _MAGIC:
        raise KvTransferError("the peer does not speak the SLOPE KV protocol (bad magic)")
    if version != PROTOCOL_VERSION:
        raise KvTransferError(f"the peer speaks KV protocol version {version}; this client speaks {PROTOCOL_VERSION}")
    if ftype not in _NAMES or zero != 0:
        raise KvTransferError(f"unknown frame type {ftype}")
    return ftype, length


def _json_payload(sock: socket.socket, ftype: int, length: int) -> dict:
    if length > _MAX_JSON:
        raise KvTransferError(f"the {_NAMES[ftype]} frame of {length} bytes is over the limit")
    try:
        body = json.loads(_recv_exact(sock, length))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise KvTransferError(f"the {_NAMES[ftype]} frame is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise KvTransferError(f"the {_NAMES[ftype]} frame must hold a JSON object")
    return body


def _refusal(body: dict) -> KvTransferError:
    return KvTransferError(f"{body.get('error', '(no message)')} [{body.get('code', '')}]")


def _read_json(sock: socket.socket, want: int) -> dict:
    ftype, length = _read_header(sock)
    body = _json_payload(sock, ftype, length)
    if ftype == ERROR:
        raise _refusal(body)
    if ftype != want:
        raise KvTransferError(f"expected a {_NAMES[want]} frame, got {_NAMES[ftype]}")
    return body


def _is_int(v, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _check_manifest(m: dict) -> None:
    """Every field _receive_shard and assemble use, of the type and range docs/kv-format.md gives:
    a manifest that breaks them is a KvTransferError naming the field."""
    def need(ok: bool, what: str):
        if not ok:
            raise KvTransferError(f"the manifest's {what}")

    if m.get("version") != PROTOCOL_VERSION:
        raise KvTransferError(f"manifest of protocol version {m.get('version')}")
    need(m.get("dtype") in ("f32", "bf16"), f"dtype {m.get('dtype')!r} is not f32 or bf16")
    for key in ("kv_id", "model", "model_hash", "architecture"):
        need(isinstance(m.get(key), str), f"\"{key}\" is not a string")
    need(isinstance(m.get("window_trim"), bool), "\"window_trim\" is not true or false")
    for key, lo in (("num_tokens", 1), ("num_kv_heads", 1), ("head_dim", 1), ("num_layers", 1), ("rank", 0),
                    ("kv_head0", 0), ("kv_heads", 1), ("bytes", 0), ("untrimmed_bytes", 0)):
        need(_is_int(m.get(key), lo), f"\"{key}\" is not an integer >= {lo}")
    need(m["kv_head0"] + m["kv_heads"] <= m["num_kv_heads"],
         f"KV heads {m['kv_head0']}..{m['kv_head0'] + m['kv_heads']} are not heads of the model's {m['num_kv_heads']}")
    need("first_token" not in m or m["first_token"] is None or _is_int(m["first_token"], -(1 << 63)),
         "\"first_token\" is not a token id")
    need(isinstance(m.get("layers"), list) and isinstance(m.get("tensors"), list), "\"layers\" or \"tensors\" is not a list")
    rows = {}
    for e in m["layers"]:
        need(isinstance(e, dict) and _is_int(e.get("layer")) and e["layer"] < m["num_layers"] and e["layer"] not in rows,
             f"layer entry {e!r} does not name a new layer below num_layers")
        need(_is_int(e.get("window")), f"layer {e['layer']}'s window is not an integer >= 0")
        need(isinstance(e.get("ranges"), list) and all(isinstance(r, list) and len(r) == 2 and _is_int(r[0]) and
                                                       _is_int(r[1]) for r in e["ranges"]),
             f"layer {e['layer']}'s ranges are not [start, count] pairs")
        rows[e["layer"]] = sum(count for _, count in e["ranges"])
    elem = 4 if m["dtype"] == "f32" else 2
    want = [(f"layers.{layer}.{kind}", n) for layer, n in rows.items() for kind in ("k", "v")]
    need(len(m["tensors"]) == len(want), f"{len(m['tensors'])} tensors do not match its {len(rows)} layers")
    for entry, (name, n) in zip(m["tensors"], want):
        need(isinstance(entry, dict) and entry.get("name") == name, f"tensor {entry!r} is not {name}")
        shape = [n, m["kv_heads"], m["head_dim"]]
        need(entry.get("shape") == shape, f"{name} shape {entry.get('shape')!r} is not {shape}")
        need(entry.get("bytes") == n * m["kv_heads"] * m["head_dim"] * elem, f"{name} bytes do not match its shape")
        need(isinstance(entry.get("crc32"), str), f"{name} crc32 is not a string")


def _receive_shard(sock: socket.socket, verify: bool) -> tuple[dict, dict[str, np.ndarray]]:
    """The manifest and tensors a rank sends; acks once every checksum matched (else an error frame)."""
    manifest = _read_json(sock, MANIFEST)
    _check_manifest(manifest)
    dtype = manifest["dtype"]
    tensors = {}
    for entry in manifest["tensors"]:
        ftype, length = _read_header(sock)
        if ftype == ERROR:
            raise _refusal(_json_payload(sock, ftype, length))
        if ftype != TENSOR or length != entry["bytes"]:
            raise KvTransferError(f"{entry['name']}: expected a tensor frame of {entry['bytes']} bytes, "
                                  f"got {_NAMES.get(ftype)} of {length}")
        raw = _recv_exact(sock, length)
        if verify and format(zlib.crc32(raw), "08x") != entry["crc32"]:
            _send_json(sock, ERROR, {"error": f"checksum of {entry['name']} does not match", "code": "checksum"})
            raise KvTransferError(f"{entry['name']}: the checksum does not match (corrupted in transit)")
        if dtype == "f32":
            a = np.frombuffer(raw, dtype="<f4")
        else:
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        tensors[entry["name"]] = a.reshape(entry["shape"])
    _send_json(sock, ACK, {"ok": True})
    released = _read_json(sock, ACK)
    if not released.get("released"):
        raise KvTransferError("the rank did not confirm the release")
    return manifest, tensors


def _pull_rank(rank: dict, kv_id: str, api_key: str | None, dtype: str, window_trim: bool, verify: bool,
               timeout: float) -> tuple[dict, dict]:
    host, _, port = rank["endpoint"].rpartition(":")
    host = host.strip("[]")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.settimeout(timeout)
        hello = {"kv_id": kv_id, "dtype": dtype, "window_trim": window_trim}
        if api_key is not None:
            hello["api_key"] = api_key
        _send_json(sock, HELLO, hello)
        return _receive_shard(sock, verify)


def assemble(shards: list[tuple[dict, dict]], first_token: int | None = None) -> KvCache:
    """One KvCache from every owner rank's (manifest, tensors): each (layer, position, head) must
    come exactly once. A trimmed sliding-window layer holds positions N - W .. N - 1."""
    if not shards:
        raise KvTransferError("no shard to assemble")
    m0 = shards[0][0]
    n, hkv, d, num_layers = m0["num_tokens"], m0["num_kv_heads"], m0["head_dim"], m0["num_layers"]
    for m, _ in shards:
        for key in ("kv_id", "model_hash", "num_tokens", "num_kv_heads", "head_dim", "num_layers", "dtype", "window_trim"):
            if m[key] != m0[key]:
                raise KvTransferError(f"ranks {m0['rank']} and {m['rank']} disagree on {key}")
    windows: dict[int, int] = {}
    sent: dict[int, int] = {}  # (position, head) pairs each layer's entries cover
    for m, _ in shards:
        for entry in m["layers"]:
            i = entry["layer"]
            if windows.setdefault(i, entry["window"]) != entry["window"]:
                raise KvTransferError(f"ranks disagree on the window of layer {i}")
            sent[i] = sent.get(i, 0) + sum(count for _, count in entry["ranges"]) * m["kv_heads"]
    trim = m0["window_trim"]
    ks, vs, filled, firsts = {}, {}, {}, {}
    for i in range(num_layers):
        if i not in windows:
            raise KvTransferError(f"no rank sent layer {i}")
        first = max(0, n - windows[i]) if trim and windows[i] > 0 else 0
        firsts[i] = first
        if sent[i] != (n - first) * hkv:  # checked before the buffers are made: n is the peer's word
            raise KvTransferError(f"layer {i}: the ranks sent {sent[i]} (position, KV head) rows, not the "
                                  f"{(n - first) * hkv} of {n - first} positions and {hkv} heads")
        ks[i] = np.zeros((n - first, hkv, d), np.float32)
        vs[i] = np.zeros((n - first, hkv, d), np.float32)
        filled[i] = np.zeros((n - first, hkv), np.int32)
    for m, tensors in shards:
        h0, heads = m["kv_head0"], m["kv_heads"]
        for entry in m["layers"]:
            i = entry["layer"]
            k, v = tensors[f"layers.{i}.k"], tensors[f"layers.{i}.v"]
            row = 0
            for start, count in entry["ranges"]:
                at = start - firsts[i]
                if at < 0 or at + count > ks[i].shape[0]:
                    raise KvTransferError(f"rank {m['rank']} layer {i}: rows {start}..{start + count} out of range")
                ks[i][at:at + count, h0:h0 + heads] = k[row:row + count]
                vs[i][at:at + count, h0:h0 + heads] = v[row:row + count]
                filled[i][at:at + count, h0:h0 + heads] += 1
                row += count
    layers = []
    for i in range(num_layers):
        bad = np.argwhere(filled[i] != 1)
        if bad.size:
            p, h = bad[0]
            what = "no rank" if filled[i][p, h] == 0 else "two ranks"
            raise KvTransferError(f"layer {i}: {what} sent position {p + firsts[i]} of KV head {h}")
        layers.append(LayerKv(ks[i], vs[i], first_position=firsts[i], window=windows[i]))
    meta = {key: m0[key] for key in ("kv_id", "model", "model_hash", "architecture", "dtype", "window_trim")}
    meta["bytes"] = sum(m["bytes"] for m, _ in shards)
    meta["untrimmed_bytes"] = sum(m["untrimmed_bytes"] for m, _ in shards)
    cache = KvCache(num_tokens=n, num_kv_heads=hkv, head_dim=d, architecture=m0["architecture"], layers=layers,
                    first_token=first_token if first_token is not None else m0.get("first_token"), meta=meta)
    cache.check()
    return cache


def _owners(handle: dict) -> list[dict]:
    ranks = [r for r in handle.get("ranks", []) if r.get("owner", True)]
    if not ranks or any("endpoint" not in r for r in ranks):
        raise KvTransferError("the handle has no ranks with an endpoint (is it a /v1/prefill response's \"kv\"?)")
    return ranks


def _run_all(jobs, what: str):
    results, errors = [None] * len(jobs), [None] * len(jobs)

    def run(j):
        try:
            results[j] = jobs[j][1]()
        except Exception as e:  # noqa: BLE001 - reported below with the rank
            errors[j] = e

    threads = [threading.Thread(target=run, args=(j,), daemon=True) for j in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (rank, _), e in zip(jobs, errors):
        if e is not None:
            raise KvTransferError(f"{what} rank {rank}: {e}") from e
    return results


def pull(handle: dict, api_key: str | None = None, dtype: str | None = None, window_trim: bool = True,
         verify: bool = True, timeout: float = 60.0) -> KvCache:
    """Pulls the KV cache of `handle` from every owner rank at once and assembles it.

    dtype: "f32" or "bf16" on the wire (the result is float32 either way); None: the handle's
    "dtype" (the request's kv_dtype), else f32. window_trim: sliding-window layers come with only
    their last W positions. verify: check each tensor's CRC-32 (zlib's, at memory speed).
    Each rank releases its shard on the ack, so a second pull of the same handle is refused.
    """
    dtype = dtype or handle.get("dtype") or "f32"
    if dtype not in ("f32", "bf16"):
        raise ValueError(f"dtype must be 'f32' or 'bf16', got {dtype!r}")
    kv_id = handle["id"]
    jobs = [(r["rank"], (lambda r=r: _pull_rank(r, kv_id, api_key, dtype, window_trim, verify, timeout)))
            for r in _owners(handle)]
    return assemble(_run_all(jobs, "pulling from"), handle.get("first_token"))


class PushReceiver:
    """A listening socket that takes one pushed shard per owner rank (POST /v1/kv/{id}/push).

    targets(): the body's "targets" (every owner rank to this receiver's endpoint). result():
    waits for every shard, acks each after its checksums matched, and assembles the KvCache.
    """

    def __init__(self, handle: dict, host: str = "127.0.0.1", port: int = 0, verify: bool = True,
                 timeout: float = 60.0):
        self._handle = handle
        self._ranks = _owners(handle)
        self._verify = verify
        self._timeout = timeout
        self._sock = socket.create_server((host, port))
        self._sock.settimeout(timeout)
        self.endpoint = f"{host}:{self._sock.getsockname()[1]}"
        self._shards: list = []
        self._errors: list = []
        self._thread = threading.Thread(target=self._accept_all, daemon=True)
        self._thread.start()

    def targets(self) -> list[dict]:
        return [{"rank": r["rank"], "endpoint": self.endpoint} for r in self._ranks]

    def _accept_all(self):
        workers = []
        try:
            for _ in self._ranks:
                conn, _ = self._sock.accept()
                conn.settimeout(self._timeout)
                t = threading.Thread(target=self._take, args=(conn,), daemon=True)
                t.start()
                workers.append(t)
        except OSError as e:
            self._errors.append(e)
        for t in workers:
            t.join()

    def _take(self, conn):
        with conn:
            try:
                self._shards.append(_receive_shard(conn, self._verify))
            except Exception as e:  # noqa: BLE001 - reported by result()
                self._errors.append(e)

    def result(self, timeout: float | None = None) -> KvCache:
        self._thread.join(timeout if timeout is not None else self._timeout * 2)
        self._sock.close()
        if self._thread.is_alive():
            raise KvTransferError("not every rank pushed its shard in time")
        if self._errors:
            raise KvTransferError(f"receiving a pushed shard: {self._errors[0]}")
        ids = {m["kv_id"] for m, _ in self._shards}
        if ids != {self._handle["id"]}:
            raise KvTransferError(f"pushed shards of {sorted(ids)}, expected {self._handle['id']}")
        return assemble(self._shards, self._handle.get("first_token"))


def receive_push(handle: dict, host: str = "127.0.0.1", port: int = 0, verify: bool = True,
                 timeout: float = 60.0) -> PushReceiver:
    """A receiver for a push of `handle`'s KV: send its targets() in POST /v1/kv/{id}/push, then
    call result() for the KvCache."""
    return PushReceiver(handle, host, port, verify, timeout)
