"""What a CLaSp DP run needs, copied out of the engine so it can run in a thread.

The in-engine DP (methods/clasp/search.py, ClaspSearch.run_dp) calls the decoder
layers through vLLM's Attention modules. Those read the attention metadata and
KV slots from a process-global forward context that the engine's own forward
sets, and they read the requests' paged KV blocks, which the engine frees and
reuses. Neither can be shared with a thread that runs while the engine steps.

So, on the engine thread, `take_snapshot` copies what the DP reads: for each
chosen request its last verified token's embedding (x_0) and position, and
that request's K/V prefix for every layer, gathered from the paged cache into
contiguous tensors (at most `max_context` most recent positions). The thread
then runs each decoder layer with its own weights (norms, qkv projection,
rotary embedding, o_proj, MLP) and plain torch attention over the copy
(`DPSnapshot.layer`): no forward context, no paged cache.

How K/V sit inside a paged block depends on the attention backend and, on CPU,
on the instruction set (vLLM's CPU backend stores K transposed for its vector
kernel and packed in pairs for AMX). Instead of hard-coding those layouts,
`BlockLayout.learn` writes known values through the backend's own cache-update
op into a scratch block once and reads back where each element landed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vllm_layerskip.core.model_adapter import DecoderStack


class SnapshotUnsupported(RuntimeError):
    """The KV cache cannot be copied for a background DP run (the DP then
    runs on the engine thread)."""


# Values written by the layout probe: integers that bf16/fp16 store exactly.
_DIGIT_BASE = 256
_UNWRITTEN = -1.0


@dataclass(frozen=True)
class BlockLayout:
    """Where token t, KV head h, dimension d of one paged block live in the
    block's flat storage: key_index / value_index [block_size, kv_heads, head_size]."""

    key_index: torch.Tensor
    value_index: torch.Tensor
    block_numel: int

    @classmethod
    def learn(cls, attn, kv_cache: torch.Tensor, block_size: int) -> "BlockLayout":
        """Probe the backend's layout with its own cache-update op on a
        scratch block (the real cache is not touched)."""
        if not hasattr(attn.impl, "do_kv_cache_update"):
            raise SnapshotUnsupported(
                f"attention backend {type(attn.impl).__name__} writes KV inside its "
                "forward; its block layout cannot be probed"
            )
        if kv_cache.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise SnapshotUnsupported(f"KV cache dtype {kv_cache.dtype} (quantized KV)")
        if not kv_cache.is_contiguous():
            raise SnapshotUnsupported("the KV cache tensor is not contiguous")
        heads, dim = attn.num_kv_heads, attn.head_size
        block_numel = kv_cache[0].numel()
        per_block = block_size * heads * dim
        if 2 * per_block != block_numel:
            raise SnapshotUnsupported(
                f"KV cache shape {tuple(kv_cache.shape)}: blocks are not the first "
                f"dimension (expected {2 * per_block} elements per block)"
            )
        source = torch.arange(per_block).view(block_size, heads, dim)
        slots = torch.arange(block_size, dtype=torch.int64, device=kv_cache.device)
        indices = []
        for probe_key in (True, False):
            found = torch.zeros(block_numel, dtype=torch.int64)
            written = None
            # The source index, one base-256 digit per write: each digit is exact
            # in every float KV dtype.
            for n in range(max(1, math.ceil(math.log(per_block, _DIGIT_BASE)))):
                digit = (source // _DIGIT_BASE**n) % _DIGIT_BASE
                blank = torch.full_like(digit, _UNWRITTEN, dtype=kv_cache.dtype)
                values = digit.to(kv_cache.dtype)
                key, value = (values, blank) if probe_key else (blank, values)
                scratch = torch.full_like(kv_cache[:1], _UNWRITTEN)
                attn.impl.do_kv_cache_update(
                    attn, key.to(kv_cache.device), value.to(kv_cache.device), scratch, slots
                )
                flat = scratch.reshape(-1).float().cpu()
                written = flat != _UNWRITTEN if written is None else written
                found += flat.clamp_min(0).long() * _DIGIT_BASE**n
            positions = torch.nonzero(written).flatten()
            index = torch.full((per_block,), -1, dtype=torch.int64)
            index[found[positions]] = positions
            if positions.numel() != per_block or (index < 0).any():
                raise SnapshotUnsupported("the layout probe did not find every K/V element")
            indices.append(index.view(block_size, heads, dim).to(kv_cache.device))
        return cls(indices[0], indices[1], block_numel)

    def gather_index(self, block_ids: torch.Tensor, start: int, end: int):
        """Flat cache indices of K and V for positions start..end-1 of a request
        whose blocks are `block_ids`: ([end - start, heads, dim], same)."""
        block_size = self.key_index.shape[0]
        pos = torch.arange(start, end, device=block_ids.device)
        base = (block_ids[pos // block_size] * self.block_numel)[:, None, None]
        offset = pos % block_size
        return base + self.key_index[offset], base + self.value_index[offset]


@dataclass
class DPSnapshot:
    """One DP run's inputs, owned by the snapshot (nothing points into the
    engine's KV cache)."""

    stack: DecoderStack  # the model's modules (weights only; never its Attention)
    x0: torch.Tensor  # [R, hidden] embedding of each request's last verified token
    positions: torch.Tensor  # [R] that token's position
    keys: list[list[torch.Tensor]]  # [layer][request] [kv_heads, T_r, head_size]
    values: list[list[torch.Tensor]]  # same
    scale: float  # the attention's softmax scale
    num_heads: int
    seconds: float = 0.0  # time to take it (engine thread)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for kv in (self.keys, self.values)
                   for layer in kv for t in layer)

    def layer(self, i: int, states: torch.Tensor) -> torch.Tensor:  # [R, n, H] -> [R, n, H]
        """Decoder layer i on n candidate states per request, each a query at
        the request's last verified position attending to the copied prefix
        (the K/V there are the target's, as in the in-engine DP)."""
        r, n, h = states.shape
        positions = self.positions.repeat_interleave(n)

        def attend(q, k, v):  # q [R * n, heads * dim]; k, v of the candidates unused
            q = q.view(r, n, self.num_heads, -1).transpose(1, 2)  # [R, heads, n, dim]
            out = [
                F.scaled_dot_product_attention(
                    q[j : j + 1], self.keys[i][j][None].to(q.dtype),
                    self.values[i][j][None].to(q.dtype), scale=self.scale, enable_gqa=True,
                )
                for j in range(r)
            ]
            return torch.cat(out).transpose(1, 2).reshape(r * n, -1)

        out = self.stack.run_layer(i, positions, states.reshape(r * n, h), attend)
        return out.reshape(r, n, h)


class SnapshotTaker:
    """Takes DP snapshots from one engine's KV cache (engine thread only)."""

    def __init__(self, stack: DecoderStack, max_context: int):
        self.stack = stack
        self.max_context = max_context
        self.layouts: dict[tuple, BlockLayout] = {}

    @torch.inference_mode()
    def take(self, runner, rows: np.ndarray, positions: np.ndarray) -> DPSnapshot:
        """rows: input-batch rows; positions: each one's last verified token,
        whose K/V (and all before it) the verify pass already wrote."""
        device = runner.device
        attn0 = self.stack.layers[0].self_attn.attn
        if getattr(attn0.impl, "sliding_window", None) not in (None, -1):
            raise SnapshotUnsupported("sliding-window attention")
        batch = runner.input_batch
        ids = batch.token_ids_cpu[rows, positions].astype(np.int64)
        x0 = self.stack.embed(torch.from_numpy(ids).to(device))
        group_of = {
            name: gid for gid, groups in enumerate(runner.attn_groups)
            for g in groups for name in g.layer_names
        }
        keys, values = [], []
        index_cache = {}  # per KV group: the gather indices of every request
        for layer in self.stack.layers:
            attn = layer.self_attn.attn
            kv = attn.kv_cache
            gid = group_of[attn.layer_name]
            table = batch.block_table[gid]
            layout_key = (gid, tuple(kv.shape), kv.dtype)
            if layout_key not in self.layouts:
                self.layouts[layout_key] = BlockLayout.learn(attn, kv, table.block_size)
            if gid not in index_cache:
                blocks = table.get_device_tensor(batch.num_reqs)[torch.from_numpy(rows).to(device)]
                index_cache[gid] = [
                    self.layouts[layout_key].gather_index(
                        blocks[j].long(), max(0, int(p) + 1 - self.max_context), int(p) + 1
                    )
                    for j, p in enumerate(positions)
                ]
            flat = kv.view(-1)
            # [T, heads, dim] -> [heads, T, dim]: one gather copy per tensor.
            keys.append([flat[k].transpose(0, 1) for k, _ in index_cache[gid]])
            values.append([flat[v].transpose(0, 1) for _, v in index_cache[gid]])
        return DPSnapshot(
            stack=self.stack,
            x0=x0,
            positions=torch.from_numpy(positions.astype(np.int64)).to(device),
            keys=keys,
            values=values,
            scale=float(attn0.impl.scale),
            num_heads=attn0.num_heads,
        )
