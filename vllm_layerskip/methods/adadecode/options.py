"""Options of method `adadecode`."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.options import DraftingOptions, check_number
from vllm_layerskip.methods.adadecode.heads import load_heads


@dataclass(frozen=True)
class AdaDecodeOptions(DraftingOptions):
    """Options of method `adadecode` (AdaDecode, Wei et al., ICML 2025): exit
    heads trained by `vllm-layerskip train-heads`; each draft token leaves the
    model at the first head whose top-1 probability exceeds `threshold`."""

    heads: str | None = None
    """Path of an exit heads file from `vllm-layerskip train-heads`, or "shipped"
    for the heads that ship with the plugin for this model."""
    threshold: float = 0.85
    """gamma: a draft token exits at the first head whose top-1 probability is
    above this; with no such head the request's draft stops (paper: 0.85)."""

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.heads, str) or not self.heads:
            raise LayerSkipConfigError(
                "Method 'adadecode' needs 'heads': the path of an exit heads file from "
                "`vllm-layerskip train-heads --model MODEL --prompts FILE --layers 8,15,22 "
                "--out HEADS.safetensors`, or \"shipped\" for the heads shipped for the "
                f"model; got {self.heads!r}."
            )
        check_number("threshold", self.threshold, 0.0, 1.0)

    def validate_for_model(self, model: ModelIdentity) -> None:
        super().validate_for_model(model)
        load_heads(self.heads, model)
