"""vLLM attention metadata for the draft engine's own passes: the code most
likely to break when vLLM changes (patches/hook_table.py lists what it reads).

A draft step, a scoring window or a DP layer call is a batch of queries over
requests' paged KV caches that vLLM's scheduler never planned. For each KV-cache
group this builds a `CommonAttentionMetadata` from the runner's block tables
and lets the group's own builder turn it into backend metadata (decode-shaped
for draft steps: `build_metadata_for_drafting`), plus the KV slot of every
query token for the layers that write.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata


def build_attention_metadata(
    runner,
    rows: np.ndarray,  # [R] input-batch rows
    query_lens: np.ndarray,  # [R] tokens per request, consecutive positions
    positions: np.ndarray,  # [N] position of every token, request by request
    write_kv: tuple[bool, ...],  # [num_layers]: whether each decoder layer writes its K/V
    draft_index: int | None = None,  # set: a decode-shaped draft step
):
    """Per-layer attention metadata and KV slots for the given query tokens.

    Each request's query ends at its last position, and attends causally to
    everything before it in the paged cache.
    """
    device = runner.device
    num = len(rows)
    num_tokens = len(positions)
    rows_t = torch.from_numpy(rows).to(device)
    pos_cpu = torch.from_numpy(positions.astype(np.int64))
    pos_t = pos_cpu.to(device)
    query_start_loc_cpu = torch.zeros(num + 1, dtype=torch.int32)
    query_start_loc_cpu[1:] = torch.from_numpy(np.cumsum(query_lens)).to(torch.int32)
    seq_lens_cpu = (pos_cpu[query_start_loc_cpu[1:].long() - 1] + 1).to(torch.int32)
    token_request = torch.from_numpy(np.repeat(np.arange(num), query_lens)).to(device)
    per_layer_metadata: dict[str, object] = {}
    per_layer_slots: dict[str, torch.Tensor] = {}
    for gid, groups in enumerate(runner.attn_groups):
        table = runner.input_batch.block_table[gid]
        block_table = table.get_device_tensor(runner.input_batch.num_reqs)[rows_t]
        block_size = table.block_size
        block_ids = block_table[token_request, pos_t // block_size]
        slots = block_ids.to(torch.int64) * block_size + pos_t % block_size
        common = CommonAttentionMetadata(
            query_start_loc=query_start_loc_cpu.to(device),
            query_start_loc_cpu=query_start_loc_cpu,
            seq_lens=seq_lens_cpu.to(device),
            seq_lens_cpu_upper_bound=seq_lens_cpu,
            num_reqs=num,
            num_actual_tokens=num_tokens,
            max_query_len=int(query_lens.max()) if num else 0,
            max_seq_len=int(seq_lens_cpu.max()) if num else 0,
            block_table_tensor=block_table,
            slot_mapping=slots if any(write_kv) else torch.full_like(slots, -1),
            causal=True,
            positions=pos_t,
            is_prefilling=torch.zeros(num, dtype=torch.bool, device=device),
        )
        for group in groups:
            if draft_index is not None:
                metadata = group.build_metadata_for_drafting(common, draft_index)
            else:
                metadata = group.build_metadata(common)
            for name in group.layer_names:
                per_layer_metadata[name] = metadata
                # vLLM writes a layer's K/V only where the forward context
                # has a slot mapping for it.
                if write_kv[_layer_index(name)]:
                    per_layer_slots[name] = slots
    return per_layer_metadata, per_layer_slots


_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


def _layer_index(attn_layer_name: str) -> int:
    """Decoder-layer index of an attention layer name like 'model.layers.7.self_attn.attn'."""
    match = _LAYER_INDEX.search(attn_layer_name)
    if match is None:
        raise ValueError(f"cannot tell the decoder layer of attention layer {attn_layer_name!r}")
    return int(match.group(1))
