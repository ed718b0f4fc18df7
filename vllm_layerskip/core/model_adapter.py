"""Model-family adapter: the pieces of a vLLM decoder model the draft pass calls.

Llama, Mistral, Qwen2 and Qwen3 in vLLM share one decoder-layer shape:
`input_layernorm -> self_attn -> post_attention_layernorm -> mlp`, with the
residual carried beside the hidden state and fused into the next norm. The draft
pass calls these sub-modules itself (eagerly, outside the compiled model forward),
so skipping a sub-layer is just not calling it: the pair (hidden, residual), whose
sum is the residual stream, passes through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vllm_layerskip.core.draft_layer import DraftLayer, eager_layers
from vllm_layerskip.core.draft_weights import draft_layers
from vllm_layerskip.core.errors import LayerSkipConfigError

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)

_DECODER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


def check_model_supported(model_config) -> int:
    """Raise a clear error for an unsupported model; return its layer count."""
    archs = list(getattr(model_config, "architectures", None) or [])
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise LayerSkipConfigError(
            f"vllm-layerskip does not support architecture {archs or 'unknown'} of "
            f"model '{model_config.model}'. Supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}."
        )
    return model_config.hf_text_config.num_hidden_layers


@dataclass
class DecoderStack:
    """The target model's modules, as the draft pass uses them."""

    model: nn.Module  # the *ForCausalLM (for compute_logits)
    inner: nn.Module  # its decoder (embed, layers, norm)
    layers: list[nn.Module]  # [num_layers], the decoder layers in order
    # [num_layers] the layers with quantized linears (core/draft_weights.py),
    # which draft passes run instead; None: drafts run the model's own weights.
    draft: list[DraftLayer] | None = None
    # [num_layers] the layers with the model's weights as draft passes run them
    # (core/draft_layer.py: eager custom ops on the CPU); None: `layers`.
    eager: list[DraftLayer] | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @classmethod
    def from_model(cls, model: nn.Module) -> "DecoderStack":
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if inner is None or layers is None:
            raise LayerSkipConfigError(
                f"vllm-layerskip cannot find the decoder layers of {type(model).__name__}; "
                f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}."
            )
        if (inner.start_layer, inner.end_layer) != (0, len(layers)):
            raise LayerSkipConfigError(
                "vllm-layerskip needs every decoder layer on this rank; pipeline "
                "parallelism is not supported."
            )
        for layer in layers:
            missing = [p for p in _DECODER_PARTS if not hasattr(layer, p)]
            if missing or getattr(layer, "ada_rms_norm_t_cond", None) is not None:
                raise LayerSkipConfigError(
                    f"vllm-layerskip does not support decoder layer "
                    f"{type(layer).__name__} (missing {missing or 'plain RMSNorm'})."
                )
        layers = list(layers)
        return cls(model=model, inner=inner, layers=layers, draft=draft_layers(layers),
                   eager=eager_layers(layers))

    def draft_path(self, num_tokens: int) -> list:
        """The layers a draft pass of `num_tokens` tokens runs: the quantized
        copies where there are some and the pass is small enough to gain."""
        if self.draft is not None:
            limit = self.draft[0].max_tokens  # None: passes of any size gain
            if limit is None or num_tokens <= limit:
                return self.draft
        return self.exact_path

    @property
    def exact_path(self) -> list:
        """The layers with the model's own weights, as draft passes run them."""
        return self.layers if self.eager is None else self.eager

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner.embed_input_ids(input_ids)

    def forward_masked(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        run_attn: tuple[bool, ...],  # [num_layers]
        run_mlp: tuple[bool, ...],  # [num_layers]
    ) -> torch.Tensor:  # [num_tokens, hidden], after the final norm
        """The model's forward with only the kept sub-layers.

        With every sub-layer kept (and no quantized draft weights) this calls
        the model's own modules in the order its forward does (on the CPU with
        the custom ops an eager engine calls: core/draft_layer.py), so the
        draft equals the target up to kernel effects.
        """
        hidden, residual = self.run_layers(self.embed(input_ids), None, positions,
                                           run_attn=run_attn, run_mlp=run_mlp)
        if residual is None:
            return self.inner.norm(hidden)
        hidden, _ = self.inner.norm(hidden, residual)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_tokens, vocab]
        return self.model.compute_logits(hidden)

    def run_layers(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        residual: torch.Tensor | None,  # [num_tokens, hidden], None before layer 0
        positions: torch.Tensor,  # [num_tokens]
        start: int = 0,
        end: int | None = None,
        run_attn: tuple[bool, ...] | None = None,  # [num_layers], None: every one
        run_mlp: tuple[bool, ...] | None = None,
        layers: list | None = None,  # None: draft_path(num_tokens)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decoder layers start .. end - 1, their kept sub-layers only, on vLLM's
        (hidden, residual) pair; the residual stream after them is hidden +
        residual. The one layer loop of every draft pass."""
        layers = self.draft_path(hidden.shape[0]) if layers is None else layers
        end = len(layers) if end is None else end
        for i in range(start, end):
            layer = layers[i]
            if run_attn is None or run_attn[i]:
                hidden, residual = _norm(layer.input_layernorm, hidden, residual)
                hidden = layer.self_attn(positions=positions, hidden_states=hidden)
            if run_mlp is None or run_mlp[i]:
                hidden, residual = _norm(layer.post_attention_layernorm, hidden, residual)
                hidden = layer.mlp(hidden)
        return hidden, residual

    def exit_stream(
        self,
        stream: torch.Tensor,  # [num_tokens, hidden] residual stream after some layer
        transform: torch.Tensor,  # [hidden, hidden] an exit head's T
    ) -> torch.Tensor:  # [num_tokens, hidden], what the LM head reads
        """An exit head before the LM head: the final norm on T @ h (AdaDecode's
        E* T(i) is the LM head on this)."""
        return self.inner.norm(stream @ transform.T)


def _norm(norm: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None):
    """vLLM's fused add+RMSNorm: returns (normed(hidden + residual), hidden + residual)."""
    if residual is None:
        return norm(hidden), hidden
    return norm(hidden, residual)
