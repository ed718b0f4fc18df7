"""A decoder layer as a draft pass runs it on the CPU.

A draft pass calls the model's sub-modules one by one, eagerly, outside the
compiled model forward. In a compiled engine (vLLM's default) two of those
sub-modules are then slower than in an eager engine, because vLLM dispatched
its custom ops for inductor to fuse them into the model's graph:
- the activation (SiluAndMul) is a torch.compile'd torch-native function: the
  first draft pass compiles it (0.6 s on Qwen2.5-Coder-1.5B, 2-core CPU; the
  cost model read that first pass as the draft's cost, 678 ms against 64-89 ms
  later, and kept drafting off), and each call pays a Dynamo guard check
  (44 us against ~15 us eager on SmolLM2);
- the rotary embedding runs its torch-native form, 117 us a layer against
  15 us for its CPU kernel (one token, 1.5B shapes).
So a draft layer is the model's own layer seen through proxies whose custom
ops are what an eager CPU engine calls (`forward_cpu`), and whose linear layers
may be quantized copies (core/draft_weights.py). The model's modules are never
modified: the compiled forward that verifies drafts is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn


class DraftLayer:
    """Decoder layer `layer` with, optionally, other linear layers: `linears`
    maps the names qkv_proj, o_proj, gate_up_proj, down_proj to callables with
    vLLM's linear conventions; `max_tokens` is the largest pass they gain on
    (None: any)."""

    def __init__(self, layer: nn.Module, linears: dict | None = None,
                 max_tokens: int | None = None):
        linears = linears or {}
        attn, mlp = layer.self_attn, layer.mlp
        self.input_layernorm = layer.input_layernorm
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.linears = linears
        self.max_tokens = max_tokens
        self._attn = ModuleWith(attn, **_pick(linears, "qkv_proj", "o_proj"),
                                **_eager_ops(attn, "rotary_emb"))
        self._attn_forward = type(attn).forward
        self._mlp = ModuleWith(mlp, **_pick(linears, "gate_up_proj", "down_proj"),
                               **_eager_ops(mlp, "act_fn"))
        self._mlp_forward = type(mlp).forward

    def self_attn(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._attn_forward(self._attn, positions=positions, hidden_states=hidden_states)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self._mlp_forward(self._mlp, x)


def eager_layers(layers: list[nn.Module]) -> list[DraftLayer] | None:
    """The layers as draft passes run them on this platform: on the CPU, views
    with eager custom ops; elsewhere None (the layers themselves)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    return [DraftLayer(layer) for layer in layers]


def _pick(linears: dict, *names: str) -> dict:
    return {name: linears[name] for name in names if name in linears}


def _eager_ops(module: nn.Module, *names: str) -> dict:
    """The named custom ops of `module` as an eager CPU engine calls them."""
    return {name: getattr(module, name).forward_cpu for name in names
            if _is_custom_op(getattr(module, name, None))}


def _is_custom_op(op) -> bool:
    from vllm.model_executor.custom_op import CustomOp

    return isinstance(op, CustomOp)


class ModuleWith:
    """A module seen through a proxy: the named attributes replaced, every other
    one the module's own. The module itself is never modified."""

    def __init__(self, module: nn.Module, **replaced):
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str):
        return getattr(self._module, name)
