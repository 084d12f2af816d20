"""Shared by the tests/kv checks: run `slope run --kv-serve` and pull its KV from every rank."""

from __future__ import annotations

import json
import subprocess

from slope_client import KvCache, pull


def pull_after_prefill(cmd: list[str], timeout: float = 120) -> KvCache:
    """Runs `cmd` (a `slope run ... --kv-serve` command line, under mpirun or not): rank 0 prints
    the handle as one JSON line, the KV is pulled (sliding layers trimmed), and the run must then
    exit 0 by itself, every shard being acked. Raises RuntimeError naming what went wrong."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    handle = next((json.loads(l) for l in p.stdout if l.startswith("{") and '"endpoint"' in l), None)
    cache = pull(handle) if handle else None
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "hung"
    if handle is None or rc != 0:
        raise RuntimeError(f"{' '.join(cmd)}: handle {handle}, exit {rc}:\n{p.stderr.read()[-3000:]}")
    return cache
