"""The LM head timed where a draft reads it: inside a vLLM worker, through
`LLM.apply_model`. The model's own `compute_logits` (what a full-vocabulary
draft calls) against the plugin's pruned slice (core/draft_head.py) at each
size, one token, bf16 or whatever the engine runs. Which rows a slice holds
does not change its time, so it takes the first N ids."""

from __future__ import annotations

import time


def ms_per_call(fn, repeats: int) -> float:
    """Mean milliseconds of fn() over `repeats` calls, after 3 unmeasured ones."""
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def head_times(model, sizes: list[int], repeats: int = 30) -> dict:
    """{"threads": torch threads in the worker, "full": ms, N: ms for each size}"""
    import torch

    from vllm_layerskip.core.draft_head import DraftHead
    from vllm_layerskip.core.model_adapter import DecoderStack

    weight = model.lm_head.weight
    hidden = torch.randn(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    out = {"threads": torch.get_num_threads()}
    with torch.inference_mode():
        out["full"] = ms_per_call(lambda: model.compute_logits(hidden).float(), repeats)
        stack = DecoderStack.from_model(model)
        for size in sizes:
            head = DraftHead(stack, torch.arange(size))
            out[size] = ms_per_call(lambda: head.logits(hidden), repeats)
    return out
