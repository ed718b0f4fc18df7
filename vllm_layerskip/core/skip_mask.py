"""Which sub-layers a draft pass runs, and the evenly spread set every method
starts from or compares against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SkipMask:
    """Which sub-layers the draft pass runs. Index i is decoder layer i."""

    run_attn: tuple[bool, ...]
    run_mlp: tuple[bool, ...]

    @property
    def num_layers(self) -> int:
        return len(self.run_attn)

    @property
    def num_skipped(self) -> int:
        return self.run_attn.count(False) + self.run_mlp.count(False)

    def describe(self) -> str:
        attn = [i for i, r in enumerate(self.run_attn) if not r]
        mlp = [i for i, r in enumerate(self.run_mlp) if not r]
        return f"skip attn {attn} mlp {mlp} ({self.num_skipped}/{2 * self.num_layers})"

    @classmethod
    def from_sets(
        cls, num_layers: int, skip_attn: set[int] | tuple, skip_mlp: set[int] | tuple
    ) -> "SkipMask":
        return cls(
            run_attn=tuple(i not in set(skip_attn) for i in range(num_layers)),
            run_mlp=tuple(i not in set(skip_mlp) for i in range(num_layers)),
        )

    @classmethod
    def whole_layers(cls, num_layers: int, skipped) -> "SkipMask":
        """Skip both sub-layers of each layer in `skipped`."""
        return cls.from_sets(num_layers, skipped, skipped)


def sublayer_params(text_config) -> tuple[int, int]:
    """Parameters one decoder layer's attention and MLP sub-layer read per token,
    from the config of a Llama/Qwen-shaped model (attributes of an HF config).
    Decoding reads every kept weight once per step: on memory-bound hardware a
    draft's cost follows the weights it keeps, not how many sub-layers. With
    grouped-query attention the two differ a lot: on Qwen2.5-Coder-1.5B an MLP
    holds 41M parameters and an attention sub-layer 5.5M."""
    hidden = text_config.hidden_size
    heads = text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or hidden // heads
    kv = getattr(text_config, "num_key_value_heads", None) or heads
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim  # q, o; k, v
    mlp = 3 * hidden * text_config.intermediate_size  # gate, up, down
    return attn, mlp


def uniform_skip_sets(num_layers: int, ratio: float) -> tuple[set[int], set[int]]:
    """An evenly spread set of round(ratio * 2L) sub-layers, never in the first or
    last layer: the picks sit at even steps over layers 1..L-2 and take
    attention and MLP by turns, so each kind is spread over the whole depth.

    (Until 2026-11-26 the picks were evenly spaced in the interleaved sub-layer
    order attn 1, MLP 1, attn 2, ...: where that spacing is near 2, consecutive
    picks land on the same kind, and r = 0.45 on Qwen2.5-Coder-1.5B's 28 layers
    skipped the MLP of layers 1-12 and the attention of 14-26; its drafts were
    accepted 8% of the time, bench_20261126-214552.)"""
    middle = num_layers - 2  # layers 1..L-2
    count = min(round(ratio * 2 * num_layers), 2 * max(middle, 0))
    if count <= 0:
        return set(), set()
    skip_attn, skip_mlp = set(), set()
    for k in range(count):
        # Picks of one kind are two steps apart, at least one layer: never the
        # same sub-layer twice; picks k and k + 1 may share a layer (both kinds).
        layer = 1 + int(middle * (k + 0.5) / count)
        (skip_attn if k % 2 == 0 else skip_mlp).add(layer)
    return skip_attn, skip_mlp
