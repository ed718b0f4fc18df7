"""Options of method `swift`."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.options import (
    DraftingOptions,
    check_int,
    check_number,
    check_share,
)
from vllm_layerskip.methods.swift.state_file import load_state


@dataclass(frozen=True)
class SwiftOptions(DraftingOptions):
    """Options of method `swift` (defaults: SWIFT paper, Appendix B.2, and its
    reference code)."""

    skip_ratio: float = 0.45
    """r: fraction of the 2(L-2) attention/MLP sub-layers of layers 1..L-2 that
    the draft skips (the first and last layer always run)."""
    context_window: int = 32
    """gamma: recent generated tokens per request that score a candidate set."""
    bo_interval: int = 25
    """beta: every beta-th candidate comes from Bayesian optimization, the
    others from random search."""
    max_optimization_steps: int = 1000
    """S: most candidates scored in one optimization phase."""
    patience: int = 300
    """Stop optimizing after this many candidates without a better set."""
    target_matchness: float = 0.95
    """Stop optimizing once the best set's matchness exceeds this."""
    draft_confidence_threshold: float = 0.8
    """epsilon: stop a request's draft once the top-1 probability is below this."""
    acceptance_tolerance: float = 0.7
    """When an optimization phase ends with draft acceptance below this, lower
    the skip ratio by `skip_ratio_step` and optimize again (0 disables)."""
    skip_ratio_step: float = 0.05
    """How much the skip ratio drops each time acceptance stays too low."""
    reoptimize_below: float = 0.6
    """After optimizing, resume it from the best set when recent acceptance
    falls below this fraction of the acceptance measured right after the
    optimization ended (the text stream changed). 0 disables."""
    confirm_duels: int = 2
    """A candidate that beats the best set on one scoring window (a paired duel:
    both scored on the same tokens) replaces it only after beating it again on
    this many later windows that score none of the same positions; its recorded
    matchness is its mean over those duels. 0 switches at once, as the paper
    does. Why: with single-window duels, SWIFT's learned set for
    Qwen2.5-Coder-1.5B claimed matchness 0.81 against 0.62 and then accepted
    1.03x the starting set's tokens on the very prompts it was learned on
    (benchmarks/results/2026-11-26/set_acceptance_20261126.md)."""
    optimize_interval: int = 1
    """Decoding steps per optimization step while optimizing."""
    max_score_tokens: int = 128
    """Most tokens one scoring pass covers (windows of the running requests)."""
    max_optimizer_share: float = 0.01
    """Most of the engine's busy time spent optimizing: scoring candidates, plus
    the CPU time of the optimizer thread (Gaussian process); an optimization
    step waits until the share has earned what the last one cost. Enforced over
    short stretches (unused time is saved up only to what the share earns in 5 s),
    not only on average. 1 = score every
    step (the paper's setting). Keeps optimizing from making serving slower than
    plain decoding (at 0.03, swift ran at 0.92-0.94x plain in 6 of 13 Spec-Bench
    categories here, benchmarks/results/2026-11-24/bench_20261124-021213.md)."""
    seed: int = 0
    """Seed of the random search and the Bayesian optimizer."""
    state_file: str | None = None
    """JSON file to load the learned set and optimizer history from at start-up
    (if it exists) and to save them to as they improve; "shipped": the state
    shipped for the running model (learned offline, read only)."""

    def __post_init__(self):
        super().__post_init__()
        r = self.skip_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r < 1.0:
            raise LayerSkipConfigError(
                f"'skip_ratio' must be a number in (0, 1), got {r!r}. SWIFT skips this "
                "fraction of the attention and MLP sub-layers; the paper uses 0.45-0.5."
            )
        check_int("context_window", self.context_window, minimum=1, unit="tokens")
        check_int("bo_interval", self.bo_interval, minimum=1, unit="optimization steps")
        check_int("max_optimization_steps", self.max_optimization_steps, minimum=0, unit="steps")
        check_int("patience", self.patience, minimum=1, unit="optimization steps")
        check_number("target_matchness", self.target_matchness, 0.0, 1.0)
        check_number("acceptance_tolerance", self.acceptance_tolerance, 0.0, 1.0)
        check_number("skip_ratio_step", self.skip_ratio_step, 0.0, 1.0)
        check_number("reoptimize_below", self.reoptimize_below, 0.0, 1.0)
        check_int("confirm_duels", self.confirm_duels, minimum=0, unit="duels")
        check_int("optimize_interval", self.optimize_interval, minimum=1, unit="steps")
        check_int("max_score_tokens", self.max_score_tokens, minimum=1, unit="tokens")
        check_share("max_optimizer_share", self.max_optimizer_share)
        check_int("seed", self.seed, minimum=0, unit="")
        if self.state_file is not None and (
            not isinstance(self.state_file, str) or not self.state_file
        ):
            raise LayerSkipConfigError(
                f"'state_file' must be a file path (string) or \"shipped\", got "
                f"{self.state_file!r}."
            )

    def num_skipped(self, num_layers: int, ratio: float | None = None) -> int:
        """How many sub-layers the set skips at ratio r: round(r * 2(L-2))."""
        r = self.skip_ratio if ratio is None else ratio
        return round(r * 2 * max(num_layers - 2, 0))

    def validate_for_model(self, model: ModelIdentity) -> None:
        super().validate_for_model(model)
        if model.num_layers < 3:
            raise LayerSkipConfigError(
                f"Method 'swift' needs a model with at least 3 decoder layers (it never "
                f"skips the first and last); this one has {model.num_layers}."
            )
        if self.num_skipped(model.num_layers) < 1:
            raise LayerSkipConfigError(
                f"'skip_ratio' {self.skip_ratio} skips no sub-layer of this model "
                f"({2 * (model.num_layers - 2)} candidates); raise it."
            )
        if self.state_file is not None:
            load_state(self.state_file, model)  # raises on a corrupt or foreign file
