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


def uniform_skip_sets(num_layers: int, ratio: float) -> tuple[set[int], set[int]]:
    """An evenly spread set of round(ratio * 2L) sub-layers, never in the first or
    last layer. Attention and MLP sub-layers alternate in the spread, so a ratio of
    0.5 on layers 1..L-2 skips every other sub-layer."""
    # Sub-layer s: layer s // 2, attention if s is even else MLP.
    candidates = list(range(2, 2 * (num_layers - 1)))
    count = min(round(ratio * 2 * num_layers), len(candidates))
    if count <= 0:
        return set(), set()
    step = len(candidates) / count
    chosen = [candidates[int(step * k + step / 2)] for k in range(count)]
    skip_attn = {s // 2 for s in chosen if s % 2 == 0}
    skip_mlp = {s // 2 for s in chosen if s % 2 == 1}
    return skip_attn, skip_mlp
