#!/usr/bin/env python3
"""slope_client.llamacpp's state writer without llama.cpp: framing, layouts, the RoPE permutation
and the refusals. (tests/kv/check_llamacpp.py restores the states into llama.cpp itself.)

Exit 0 pass, 1 fail, 77 when numpy is absent.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
try:
    import numpy as np
    from slope_client.cache import KvCache, LayerKv
    from slope_client import llamacpp as lc
except ImportError as e:
    print(f"SKIPPED: {e}", file=sys.stderr)
    sys.exit(77)

N, H, D = 20, 2, 8


def make_cache(windows, n=N, first_positions=None):
    rng = np.random.default_rng(1)
    layers = []
    for i, w in enumerate(windows):
        p0 = first_positions[i] if first_positions else 0
        k = rng.standard_normal((n - p0, H, D)).astype(np.float32)
        v = rng.standard_normal((n - p0, H, D)).astype(np.float32)
        layers.append(LayerKv(k, v, p0, w))
    return KvCache(n, H, D, "test", layers)


GPT_OSS = lc.GgufLayout("gpt-oss", 4, H, D, D, [True, False, True, False], 16, "neox")
LLAMA = lc.GgufLayout("llama", 2, H, D, D, [False, False], 0, "norm")


def test_gpt_oss_sections():
    cache = make_cache([16, 0, 16, 0])
    for fa in (False, True):
        body = lc.seq_state_body(cache, GPT_OSS, flash_attn=fa)
        full, swa = lc.read_seq_state_body(body, GPT_OSS)
        assert full.positions.tolist() == list(range(N)), full.positions
        assert swa.positions.tolist() == list(range(N - 16, N)), swa.positions  # only the window
        assert full.v_trans == (not fa) and swa.v_trans == (not fa)
        # full section: layers 1, 3; SWA: layers 0, 2; NEOX: K as SLOPE holds it
        assert np.array_equal(full.k[1], cache.layers[3].k.reshape(N, H * D))
        assert np.array_equal(swa.k[0], cache.layers[0].k[N - 16:].reshape(16, H * D))
        assert np.array_equal(swa.v[1], cache.layers[2].v[N - 16:].reshape(16, H * D))


def test_v_transposed_bytes():
    cache = make_cache([0, 0])
    body = lc.seq_state_body(cache, LLAMA, flash_attn=False)
    # after n_stream, cell_count, cells, v_trans, n_layer and both K blocks: the first V header
    off = 4 + 4 + 12 * N + 8 + 2 * (12 + N * H * D * 4)
    t, el, n_embd = struct.unpack_from("<iII", body, off)
    assert (t, el, n_embd) == (0, 4, H * D), (t, el, n_embd)
    first_row = np.frombuffer(body, "<f4", N, off + 12)  # V^T row 0: element 0 of every cell
    assert np.array_equal(first_row, cache.layers[0].v[:, 0, 0])


def rope_pairs(x, pos, pairs):
    """Rotates x's dimension pairs (a, b) by pos * base^(-2i/d) for the i-th pair."""
    out = x.copy()
    d = x.shape[-1]
    for i, (a, b) in enumerate(pairs):
        th = pos * 10000.0 ** (-2.0 * i / d)
        c, s = np.cos(th), np.sin(th)
        out[..., a] = x[..., a] * c - x[..., b] * s
        out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def test_norm_permutation_commutes_with_rope():
    # HF rotates (i, i + d/2); llama.cpp's NORM rotates (2i, 2i + 1) of the converter-permuted
    # head. The permuted HF result must equal NORM applied to the permuted input.
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, D))
    perm = lc.norm_rope_permutation(D)
    hf = rope_pairs(x, 7.0, [(i, i + D // 2) for i in range(D // 2)])
    norm = rope_pairs(x[:, perm], 7.0, [(2 * i, 2 * i + 1) for i in range(D // 2)])
    assert np.allclose(hf[:, perm], norm), (hf[:, perm], norm)
    # and the writer applies it to K only
    cache = make_cache([0, 0])
    sec = lc.read_seq_state_body(lc.seq_state_body(cache, LLAMA, flash_attn=True), LLAMA)[0]
    assert np.array_equal(sec.k[0].reshape(N, H, D), cache.layers[0].k[:, :, perm])
    assert np.array_equal(sec.v[0].reshape(N, H, D), cache.layers[0].v)


def test_cache_types():
    cache = make_cache([0, 0])
    for t, tol in (("f16", 1e-3), ("bf16", 1e-2)):
        sec = lc.read_seq_state_body(lc.seq_state_body(cache, LLAMA, flash_attn=False, type_k=t, type_v=t), LLAMA)[0]
        assert sec.k_types == [lc.GGML_TYPES[t]] * 2
        assert np.allclose(sec.v[1].reshape(N, H, D), cache.layers[1].v, rtol=tol, atol=tol)


def test_file_and_buffer_framing():
    cache = make_cache([0, 0])
    tokens = list(range(100, 100 + N))
    body = lc.seq_state_body(cache, LLAMA, flash_attn=True)
    data = lc.seq_state_data(cache, LLAMA, flash_attn=True, seq_id=3)
    assert struct.unpack_from("<Ii", data) == (0xAF143CD8, 3)
    assert data[8:] == lc.seq_state_body(cache, LLAMA, flash_attn=True, seq_id=3)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.ggsq")
        size = lc.write_seq_state_file(path, cache, tokens, LLAMA, flash_attn=True)
        raw = open(path, "rb").read()
    assert size == len(raw) == 12 + 4 * N + len(body)
    assert raw[:4] == b"qsgg" and struct.unpack_from("<II", raw, 4) == (3, N)  # 'ggsq' little endian
    assert list(struct.unpack_from(f"<{N}i", raw, 12)) == tokens and raw[12 + 4 * N:] == body


def expect_error(fn, words):
    try:
        fn()
    except ValueError as e:
        msg = str(e)
        assert all(w in msg for w in words), f"message {msg!r} lacks {words}"
        return
    raise AssertionError(f"no error (wanted one naming {words})")


def test_refusals():
    cache = make_cache([0, 0])
    expect_error(lambda: lc.write_seq_state_file("/nonexistent/x", cache, range(N), LLAMA, version=4,
                                                 flash_attn=True), ["version 4", "version 3"])
    expect_error(lambda: lc.write_seq_state_file("/nonexistent/x", cache, range(N - 1), LLAMA, flash_attn=True),
                 [f"{N - 1} tokens", f"{N} positions"])
    expect_error(lambda: lc.seq_state_body(make_cache([0, 0, 0, 0]), GPT_OSS, flash_attn=True), ["layer 0", "window"])
    expect_error(lambda: lc.seq_state_body(make_cache([0, 0, 0]), LLAMA, flash_attn=True), ["3 layers", "2"])
    expect_error(lambda: lc.seq_state_body(cache, LLAMA, flash_attn=True, type_k="q8_0"), ["type_k", "q8_0"])
    # an SWA layer trimmed shorter than llama.cpp's window
    short = make_cache([16, 0, 16, 0], first_positions=[10, 0, 0, 0])
    expect_error(lambda: lc.seq_state_body(short, GPT_OSS, flash_attn=True), ["layer 0", "from 10", "from 4"])
    # trimmed to exactly the window is enough
    trimmed = make_cache([16, 0, 16, 0], first_positions=[4, 0, 4, 0])
    lc.seq_state_body(trimmed, GPT_OSS, flash_attn=True)
    expect_error(lambda: lc.read_seq_state_body(lc.seq_state_body(cache, LLAMA, flash_attn=True)[:-1], LLAMA),
                 ["truncated"])


def main() -> int:
    tests = [(k, v) for k, v in globals().items() if k.startswith("test_") and callable(v)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
    print(f"{len(tests) - failed}/{len(tests)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
