"""The draft engine as CLaSp's DP sees it: decoder layers one at a time on
residual-stream states, reading the target's KV cache and writing none."""

from __future__ import annotations

import numpy as np
import torch
from vllm.forward_context import set_forward_context


class LayerStates:
    def __init__(self, engine):
        self.engine = engine

    @property
    def stack(self):
        return self.engine.stack

    @property
    def num_layers(self) -> int:
        return self.engine.num_layers

    def state_metadata(self, runner, rows: np.ndarray, positions: np.ndarray):
        """Attention metadata for one query per (row, position) that writes no KV.

        Rows may repeat (several candidate states of one request at the same
        position): each entry is its own one-token query over that request's
        cached prefix. Build it once and pass it to every `run_layer` call on
        the same (rows, positions).
        """
        ones = np.ones(len(rows), dtype=np.int64)
        return self.engine.attention_metadata(runner, rows, ones, positions, write_kv=False)

    @torch.inference_mode()
    def run_layer(
        self,
        runner,
        layer_index: int,
        rows: np.ndarray,  # [N] input-batch rows, may repeat
        positions: np.ndarray,  # [N]
        states: torch.Tensor,  # [N, hidden] residual stream before the layer
        metadata=None,  # from state_metadata(runner, rows, positions)
    ) -> torch.Tensor:  # [N, hidden] residual stream after the layer
        """Decoder layer `layer_index` (the model's own weights) on residual-stream
        states, writing no KV. The attention reads the request's paged cache at
        positions 0..position, so at a position the target already processed the
        query attends to the target's own K/V there, not to K/V of `states`."""
        if metadata is None:
            metadata = self.state_metadata(runner, rows, positions)
        attn_metadata, slot_mapping = metadata
        pos_t = torch.from_numpy(positions.astype(np.int64)).to(runner.device)
        with set_forward_context(attn_metadata, self.engine.vllm_config, num_tokens=len(rows),
                                 slot_mapping=slot_mapping):
            # vLLM's pair convention with a zero residual: the fused add+norm
            # sees states + 0 = states. Both inputs are fresh tensors because
            # the fused norm may update them in place.
            hidden, residual = self.stack.run_layers(
                states.clone(), torch.zeros_like(states), pos_t, layer_index, layer_index + 1,
                layers=self.stack.exact_path)
        return hidden + residual

    @torch.inference_mode()
    def layer_states(
        self,
        runner,
        rows: np.ndarray,  # [B] input-batch rows
        input_ids: np.ndarray,  # [B] token at each position
        positions: np.ndarray,  # [B] positions whose KV the target already wrote
    ) -> torch.Tensor:  # [num_layers + 1, B, hidden]
        """The full model's residual stream x_0 (embedding) .. x_L (before the
        final norm) of one token per request, recomputed with no KV writes."""
        metadata = self.state_metadata(runner, rows, positions)
        ids_t = torch.from_numpy(input_ids.astype(np.int64)).to(runner.device)
        states = [self.stack.embed(ids_t)]
        for i in range(self.num_layers):
            states.append(self.run_layer(runner, i, rows, positions, states[-1], metadata))
        return torch.stack(states)
