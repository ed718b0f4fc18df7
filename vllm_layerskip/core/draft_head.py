"""The LM head a draft pass reads: the model's own, or a slice of it that scores
only a pruned draft vocabulary (FR-Spec's idea, for a self-draft).

Skipping layers leaves the LM head's cost untouched: on Qwen2.5-Coder-1.5B it
is 151,936 x 1,536 weights, about 15% of the bytes a decode step reads on a
memory-bound CPU. A pruned head holds the rows of the `token_ids` the draft may
propose (a frequency-ranked subset, core/draft_vocab/), gathered once at load,
and the draft picks among them; verification always uses the full vocabulary,
so the output stays the target's:

- greedy: the draft token is the argmax over the subset;
- sampled: q is the softmax over the subset and zero elsewhere; vLLM's
  rejection sampler gets it as a full-vocabulary distribution, accepts a draft
  x with probability min(1, p(x) / q(x)) and otherwise resamples from
  max(0, p - q), which is p's mass outside the subset and the excess inside.

With draft weights (core/draft_weights.py) the slice's rows are also kept at
4 bits, which passes of up to 4 tokens read, and the best columns of those
logits are scored again with the model's rows: the 65,536-id slice of
Qwen2.5-Coder-1.5B is 57 MB instead of 201 MB and 1.8 ms a token instead of
5.1 (caches cold), of int4 draft passes of 32-43 ms
(benchmarks/draft_pass_breakdown.py, 2026-12-02).

Under tensor parallelism each rank holds a contiguous shard of the head's rows
(vLLM's VocabParallelEmbedding): each rank gathers the subset ids in its
shard, computes their logits, and an all-gather over the tensor-parallel group
puts every rank's slice together in the subset's order (the same on every
rank: the shard ranges are known to all).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vllm_layerskip.core.draft_weights import MAX_TOKENS, QuantizedLinear
from vllm_layerskip.core.model_adapter import DecoderStack


class DraftHead:
    """logits(hidden) -> [num_tokens, V] float32, where V is the full vocabulary
    or the pruned one; `to_token_ids` maps column indices to vocabulary ids."""

    def __init__(self, stack: DecoderStack, token_ids: torch.Tensor | None = None):
        self.stack = stack
        self.token_ids = None if token_ids is None else token_ids.to(torch.int64).cpu()
        # The ids on each device they are used on, copied once: drafted columns
        # come back to the host, sampled q rows and SWIFT's scoring stay on the
        # model's device. A copy per call (65536 ids, pageable) took 42 us on an
        # H200, half of the pruned head's own 87 us, for every sampled draft
        # token (benchmarks/results/2026-11-26/draft_head_h200_2026-11-26.md).
        self._ids_on_device: dict[torch.device, torch.Tensor] = {}
        self._slice: _HeadSlice | None = None
        if self.token_ids is not None:
            self._slice = _HeadSlice(stack.model, self.token_ids,
                                     quantized_rows=stack.draft is not None)

    @property
    def pruned(self) -> bool:
        return self.token_ids is not None

    @property
    def quantized_bytes(self) -> int:
        """Bytes of the slice's quantized copy (0: none)."""
        copy = None if self._slice is None else self._slice.quantized
        return 0 if copy is None else copy.nbytes

    def num_columns(self, full_vocab_size: int) -> int:
        return full_vocab_size if self.token_ids is None else self.token_ids.numel()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_tokens, V] float32
        if self._slice is None:
            return self.stack.logits(hidden).float()
        return self._slice(hidden).float()

    def to_token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids of logit columns (identity for the full head)."""
        if self.token_ids is None:
            return columns
        return self._ids_on(columns.device)[columns]

    def scatter(self, q: torch.Tensor, out: torch.Tensor) -> None:
        """Write a distribution over the head's columns into a full-vocabulary row
        (zero outside the subset): out[..., token_ids] = q."""
        if self.token_ids is None:
            out.copy_(q)
        else:
            out.zero_()
            out[..., self._ids_on(out.device)] = q

    def _ids_on(self, device: torch.device) -> torch.Tensor:
        ids = self._ids_on_device.get(device)
        if ids is None:
            ids = self._ids_on_device[device] = self.token_ids.to(device)
        return ids


# Columns of a quantized head's logits scored again with the model's rows.
RESCORED = 16


class _HeadSlice(nn.Module):
    """Rows `token_ids` of the model's LM head, as their own linear layer."""

    def __init__(self, model: nn.Module, token_ids: torch.Tensor,
                 quantized_rows: bool = False):
        super().__init__()
        lm_head = model.lm_head
        processor = model.logits_processor
        weight = getattr(lm_head, "weight", None)
        if weight is None or weight.ndim != 2 or weight.numel() == 0:
            raise ValueError(
                f"the LM head of {type(model).__name__} has no plain weight to slice "
                "(quantized?); a pruned draft vocabulary needs one"
            )
        self.scale = float(getattr(processor, "scale", 1.0))
        self.soft_cap = getattr(processor, "soft_cap", None)
        ids = token_ids.cpu().numpy()
        shard = getattr(lm_head, "shard_indices", None)
        start = shard.org_vocab_start_index if shard is not None else 0
        end = shard.org_vocab_end_index if shard is not None else weight.shape[0]
        self.tp_size = getattr(lm_head, "tp_size", 1)
        local = (ids >= start) & (ids < end)
        rows = torch.from_numpy(ids[local] - start).to(weight.device)
        self.weight = nn.Parameter(weight.detach()[rows].clone(), requires_grad=False)
        self.bias = None
        if self.tp_size > 1:
            width, order = _tensor_parallel_order(ids, lm_head, self.tp_size)
            self._gather_order = (width, order.to(weight.device))
        _use_fast_cpu_gemm(self)
        # With draft weights (quantized_rows), the rows again at 4 bits, whatever
        # the layers' scheme, for passes small enough to gain from torch's int4
        # kernel (MAX_TOKENS); None: the model's rows alone. The int4 logits'
        # RESCORED best columns are scored again with the model's rows, so the
        # draft's choice is the model rows' whenever it is among them: on
        # Qwen2.5-Coder-1.5B (int4 layers, 65536 ids, K = 4, 24 held-out prompts,
        # bf16) int4 logits alone cut M from 4.89 to 4.69 (first drafted token
        # accepted 0.967 against 0.991); int8 rows kept 4.89 but took 3.8 ms a
        # token against int4's 1.8 and the bf16 rows' 5.1 (caches cold;
        # benchmarks/results/2026-12-02/head_precision_qwen_20261202.md).
        self.quantized = None
        self.max_quantized_tokens = None
        if quantized_rows:
            self.quantized = QuantizedLinear(self, "int4")
            self.max_quantized_tokens = MAX_TOKENS[self.quantized.scheme]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        limit = self.max_quantized_tokens
        if self.quantized is not None and (limit is None or hidden.shape[0] <= limit):
            logits = self._rescored(hidden, self.quantized.matmul(hidden))
        elif hasattr(self, "cpu_linear"):
            logits = self.cpu_linear(hidden, self.weight, None)
        else:
            logits = nn.functional.linear(hidden, self.weight)
        if self.tp_size > 1:
            logits = self._gather(logits)
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        if self.scale != 1.0:
            logits = logits * self.scale
        return logits

    def _rescored(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """`logits` from the quantized rows, their RESCORED best columns per token
        replaced by the model rows' exact logits."""
        top = logits.topk(min(RESCORED, logits.shape[-1]), dim=-1).indices  # [n, R]
        rows = self.weight[top].float()  # [n, R, hidden]
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)
        return logits.scatter(-1, top, exact.to(logits.dtype))

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        from vllm.distributed import tensor_model_parallel_all_gather

        padded_width, order = self._gather_order
        if local.shape[-1] < padded_width:
            pad = local.new_zeros(*local.shape[:-1], padded_width - local.shape[-1])
            local = torch.cat([local, pad], dim=-1)
        gathered = tensor_model_parallel_all_gather(local.contiguous(), dim=-1)
        return gathered[..., order]


def _tensor_parallel_order(ids: np.ndarray, lm_head, tp_size: int) -> tuple[int, torch.Tensor]:
    """Where each subset id lands after an all-gather of every rank's slice,
    each padded to the widest: (padded width, [V_sub] column index per id)."""
    shards = [
        type(lm_head)._get_indices(lm_head.num_embeddings_padded, lm_head.org_vocab_size_padded,
                                   lm_head.num_embeddings, lm_head.org_vocab_size, r, tp_size)
        for r in range(tp_size)
    ]
    bounds = [(s.org_vocab_start_index, s.org_vocab_end_index) for s in shards]
    local_lists = [np.flatnonzero((ids >= lo) & (ids < hi)) for lo, hi in bounds]
    width = max(len(x) for x in local_lists)
    position = np.empty(len(ids), dtype=np.int64)
    for rank, members in enumerate(local_lists):
        position[members] = rank * width + np.arange(len(members))
    return width, torch.from_numpy(position)


def _use_fast_cpu_gemm(layer: nn.Module) -> None:
    """On CPU, vLLM's linear layers run through oneDNN (or its own small-GEMM
    kernel) with pre-packed weights; torch's matmul on the same weight is
    slower per token. Give the slice the same dispatch. The weight's device
    decides (not the platform), so a head on a GPU never imports vLLM's CPU path."""
    if layer.weight.device.type != "cpu":
        return
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    except Exception:  # noqa: BLE001 - torch's matmul is a correct, slower fallback
        if hasattr(layer, "cpu_linear"):
            del layer.cpu_linear
