"""CPU rejection-sampler patch: fix vLLM 0.32's CPU `expand_kernel` fallback.

1. `vllm.utils.cpu_triton_utils._expand_kernel_impl`: without Triton-CPU, vLLM's
   CPU platform replaces the rejection sampler's Triton `expand_kernel` with this
   function, which converts its output tensor to int64 before calling the C++ op.
   For a float output (the per-token temperature that
   `apply_sampling_constraints` expands from the per-request one) the conversion
   makes a copy: the C++ op fills the copy, the real output keeps whatever
   `new_empty` left there, and target logits are divided by garbage. Sampled
   (temperature > 0) speculative decoding on CPU then rejects almost every draft
   and draws from corrupted probabilities, for every method, vLLM's ngram
   included. This replacement expands in torch for any dtype. It must be in
   place before the worker registers the CPU kernel overrides, which happens
   right after general plugins are loaded (`v1/worker/worker_base.py`).
"""

from __future__ import annotations

import torch
from vllm.utils import cpu_triton_utils

from vllm_layerskip.patches import Patch


def expand_kernel_impl(
    output,  # [num_tokens]
    input_val,  # [batch_size]
    cu_num_tokens,  # [batch_size], inclusive cumulative token counts
    replace_from,
    replace_to,
    MAX_NUM_TOKENS=None,
):
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def patches() -> list[Patch]:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    return [Patch(cpu_triton_utils, "_expand_kernel_impl", expand_kernel_impl)]
