"""Options of every layer-skip method, parsed from `--speculative-config`.

vLLM's `SpeculativeConfig` forbids unknown keys, so the plugin takes its own keys
out of the user's dict before vLLM sees it (see `patches/config.py`), validates
them here into a frozen dataclass, and attaches that dataclass to the config.
Every error names the bad key or value and says what would be accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

# Methods whose proposer works end to end. A method is listed here only once it
# really works: asking for a planned one gives a clear error, never a fallback.
AVAILABLE_METHODS = ("layer_skip", "swift", "clasp", "self_sd", "adadecode")
PLANNED_METHODS = ()

# Keys of vLLM's own SpeculativeConfig that a layer-skip method cannot take:
# the draft is the target model itself.
DRAFT_MODEL_KEYS = frozenset({"model", "draft_model_config", "quantization", "revision"})


class LayerSkipConfigError(ValueError):
    """A bad `--speculative-config` for a layer-skip method."""


@dataclass(frozen=True)
class DraftingOptions:
    """Options every layer-skip method has."""

    draft_confidence_threshold: float = 0.0
    """Stop a request's draft once the draft's top-1 probability is below this."""
    adaptive_draft_length: bool = True
    """Choose each step's draft length (0 = no drafting) from measured costs and
    acceptance, so speculation never makes decoding slower (cost_model.py)."""
    probe_interval: int = 16
    """While drafting does not pay: steps between probes (doubling up to 512)."""

    def __post_init__(self):
        _check_number("draft_confidence_threshold", self.draft_confidence_threshold, 0.0, 1.0)
        _check_bool("adaptive_draft_length", self.adaptive_draft_length)
        _check_int("probe_interval", self.probe_interval, minimum=1, unit="steps")

    def validate_for_model(self, model: "ModelIdentity") -> None:
        """Raise LayerSkipConfigError if the options cannot apply to this model."""


@dataclass(frozen=True)
class ModelIdentity:
    """What a saved profile or state file must match to be reused."""

    model: str
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def differences(self, running: "ModelIdentity", saved_as: str) -> list[str]:
        """What differs between this saved identity and the running model, as
        "key: <saved_as> X vs running Y" items (the model by directory name)."""
        import os

        diffs = [
            f"{k}: {saved_as} {getattr(self, k)!r} vs running {getattr(running, k)!r}"
            for k in ("architecture", "num_layers", "hidden_size", "vocab_size")
            if getattr(self, k) != getattr(running, k)
        ]
        name = lambda m: os.path.basename(str(m).rstrip("/"))  # noqa: E731
        if name(self.model) != name(running.model):
            diffs.append(f"model: {saved_as} {name(self.model)!r} vs running {name(running.model)!r}")
        return diffs


@dataclass(frozen=True)
class LayerSkipOptions(DraftingOptions):
    """Options of method `layer_skip`: a fixed set of skipped sub-layers."""

    skip_layers: tuple[int, ...] = ()
    """Whole decoder layers to skip (attention and MLP)."""
    skip_attn: tuple[int, ...] = ()
    """Layers whose attention sub-layer is skipped."""
    skip_mlp: tuple[int, ...] = ()
    """Layers whose MLP sub-layer is skipped."""
    skip_ratio: float | None = None
    """Fraction of the 2*L sub-layers to skip, spread evenly over the middle
    layers (first and last layer kept). Used when no explicit set is given."""

    def __post_init__(self):
        super().__post_init__()
        for key in ("skip_layers", "skip_attn", "skip_mlp"):
            values = getattr(self, key)
            if not isinstance(values, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values
            ):
                raise LayerSkipConfigError(
                    f"'{key}' must be a list of layer indices (integers), got "
                    f"{values!r}."
                )
            object.__setattr__(self, key, tuple(sorted(set(values))))
        if self.skip_ratio is not None:
            ratio = self.skip_ratio
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
                raise LayerSkipConfigError(
                    f"'skip_ratio' must be a number in [0, 1), got {ratio!r}."
                )
            if not 0.0 <= ratio < 1.0:
                raise LayerSkipConfigError(
                    f"'skip_ratio' must be in [0, 1), got {ratio}. "
                    "Use e.g. 0.3 to skip 30% of the attention and MLP sub-layers."
                )
            if self.skip_layers or self.skip_attn or self.skip_mlp:
                raise LayerSkipConfigError(
                    "'skip_ratio' cannot be combined with 'skip_layers', "
                    "'skip_attn' or 'skip_mlp': give either a ratio or an "
                    "explicit set."
                )

    def validate_for_model(self, model: ModelIdentity) -> None:
        build_mask(self, model.num_layers)  # raises on indices outside the model


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
    optimize_interval: int = 1
    """Decoding steps per optimization step while optimizing."""
    max_score_tokens: int = 128
    """Most tokens one scoring pass covers (windows of the running requests)."""
    max_optimizer_share: float = 0.01
    """Most of the engine's busy time spent optimizing: scoring candidates, plus
    the CPU time of the optimizer thread (Gaussian process); an optimization
    step that would exceed it waits. Enforced over short stretches (unused time
    is saved up only to what the share earns in 5 s), not only on average. 1 = score every
    step (the paper's setting). Keeps optimizing from making serving slower than
    plain decoding (at 0.03, swift ran at 0.92-0.94x plain in 6 of 13 Spec-Bench
    categories here, README)."""
    seed: int = 0
    """Seed of the random search and the Bayesian optimizer."""
    state_file: str | None = None
    """JSON file to load the learned set and optimizer history from at start-up
    (if it exists) and to save them to as they improve."""

    def __post_init__(self):
        super().__post_init__()
        r = self.skip_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r < 1.0:
            raise LayerSkipConfigError(
                f"'skip_ratio' must be a number in (0, 1), got {r!r}. SWIFT skips this "
                "fraction of the attention and MLP sub-layers; the paper uses 0.45-0.5."
            )
        _check_int("context_window", self.context_window, minimum=1, unit="tokens")
        _check_int("bo_interval", self.bo_interval, minimum=1, unit="optimization steps")
        _check_int("max_optimization_steps", self.max_optimization_steps, minimum=0, unit="steps")
        _check_int("patience", self.patience, minimum=1, unit="optimization steps")
        _check_number("target_matchness", self.target_matchness, 0.0, 1.0)
        _check_number("acceptance_tolerance", self.acceptance_tolerance, 0.0, 1.0)
        _check_number("skip_ratio_step", self.skip_ratio_step, 0.0, 1.0)
        _check_number("reoptimize_below", self.reoptimize_below, 0.0, 1.0)
        _check_int("optimize_interval", self.optimize_interval, minimum=1, unit="steps")
        _check_int("max_score_tokens", self.max_score_tokens, minimum=1, unit="tokens")
        _check_share("max_optimizer_share", self.max_optimizer_share)
        _check_int("seed", self.seed, minimum=0, unit="")
        if self.state_file is not None and (
            not isinstance(self.state_file, str) or not self.state_file
        ):
            raise LayerSkipConfigError(
                f"'state_file' must be a file path (string), got {self.state_file!r}."
            )

    def num_skipped(self, num_layers: int, ratio: float | None = None) -> int:
        """How many sub-layers the set skips at ratio r: round(r * 2(L-2))."""
        r = self.skip_ratio if ratio is None else ratio
        return round(r * 2 * max(num_layers - 2, 0))

    def validate_for_model(self, model: ModelIdentity) -> None:
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
            # Imported here: the state format lives with the optimizer.
            from vllm_layerskip.swift_state import load_state

            load_state(self.state_file, model)  # raises on a corrupt or foreign file


@dataclass(frozen=True)
class ClaspOptions(DraftingOptions):
    """Options of method `clasp` (CLaSp, Chen et al., ACL 2025; defaults from
    its Section 5.3)."""

    DEFAULT_SKIP_RATIO = 0.5  # class constant, not an option

    num_skip_layers: int | None = None
    """M: whole decoder layers the draft skips. Give this or `skip_ratio`."""
    skip_ratio: float | None = None
    """M as a fraction of the L decoder layers: M = round(r * L). When neither
    is given, r = 0.5 (the paper finds 40-60% best, Sec. 5.3.1)."""
    layer_optimization_interval: int = 16
    """Verify steps between DP runs. In the paper the speedup first rises with
    the interval, then falls once it passes 128 (Sec. 3.7, 5.3.2, Fig. 4b); the
    text names no single value, so 16 is our choice within that range."""
    draft_confidence_threshold: float = 0.7
    """The paper's draft-exiting threshold (Sec. 5.3.3, best near 0.7): stop a
    request's draft once the draft's top-1 probability is below it."""
    protect_first_layers: int = 0
    """The DP never skips the first this many layers (the paper protects none)."""
    protect_last_layers: int = 0
    """The DP never skips the last this many layers."""
    max_dp_requests: int = 8
    """Most running requests whose last tokens enter one DP run; with more
    running, they take turns. The DP's cost grows linearly with this."""
    background_dp: bool | None = None
    """Run the DP in a background thread on a copy of the requests' KV prefix,
    off the decoding path; the new mask takes effect at the first step after
    it is ready. Off by default (None = false) until it has passed the serving
    load test. Under tensor parallelism the DP's layer calls are collectives
    that every rank must issue in the same order, so it runs on the engine
    thread there (true is refused)."""
    max_optimizer_share: float = 0.01
    """Most of the engine's busy time the DP may take (token bucket, as SWIFT's
    `max_optimizer_share`): a due run that would exceed it waits. The DP's cost
    grows with the requests it covers; uncapped it took 10% of the time at 8
    concurrent requests here. 1 = every due run goes ahead (the paper)."""
    max_dp_context: int = 2048
    """Background DP: most recent positions per request whose K/V are copied
    for a run (older ones are not attended to). Bounds the copy's time and
    memory: per position, 2 * layers * kv_heads * head_size values."""

    def __post_init__(self):
        super().__post_init__()
        if self.num_skip_layers is not None:
            _check_int("num_skip_layers", self.num_skip_layers, minimum=1, unit="layers")
        r = self.skip_ratio
        if r is not None and (
            isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r < 1.0
        ):
            raise LayerSkipConfigError(
                f"'skip_ratio' must be a number in (0, 1), got {r!r}. CLaSp skips "
                "this fraction of the decoder layers; the paper uses 0.4-0.6."
            )
        if r is not None and self.num_skip_layers is not None:
            raise LayerSkipConfigError(
                "Give either 'num_skip_layers' or 'skip_ratio' for method 'clasp', not both."
            )
        _check_int(
            "layer_optimization_interval", self.layer_optimization_interval, minimum=1,
            unit="verify steps between DP runs",
        )
        _check_int("protect_first_layers", self.protect_first_layers, minimum=0, unit="layers")
        _check_int("protect_last_layers", self.protect_last_layers, minimum=0, unit="layers")
        _check_int("max_dp_requests", self.max_dp_requests, minimum=1, unit="requests")
        if self.background_dp is not None:
            _check_bool("background_dp", self.background_dp)
        _check_int("max_dp_context", self.max_dp_context, minimum=1, unit="positions")
        _check_share("max_optimizer_share", self.max_optimizer_share)

    def validate_for_parallelism(self, tensor_parallel_size: int) -> None:
        if tensor_parallel_size > 1 and self.background_dp:
            raise LayerSkipConfigError(
                f"'background_dp' cannot be true with tensor_parallel_size="
                f"{tensor_parallel_size}: the DP's layer calls all-reduce across ranks "
                "and must run on every rank's engine thread in the same order. Leave "
                "'background_dp' unset (or false) to run the DP synchronously."
            )

    def num_skipped(self, num_layers: int) -> int:
        """M for a model with `num_layers` decoder layers."""
        if self.num_skip_layers is not None:
            return self.num_skip_layers
        return round((self.skip_ratio or self.DEFAULT_SKIP_RATIO) * num_layers)

    def validate_for_model(self, model: ModelIdentity) -> None:
        n = model.num_layers
        m = self.num_skipped(n)
        key = "num_skip_layers" if self.num_skip_layers is not None else "skip_ratio"
        protected = self.protect_first_layers + self.protect_last_layers
        if protected >= n:
            raise LayerSkipConfigError(
                f"'protect_first_layers' + 'protect_last_layers' = {protected} protects "
                f"every one of the model's {n} decoder layers; nothing is left to skip."
            )
        if m < 1:
            raise LayerSkipConfigError(
                f"'skip_ratio' {self.skip_ratio} skips no layer of this model "
                f"({n} decoder layers); raise it."
            )
        most = min(n - 1, n - protected)
        if m > most:
            raise LayerSkipConfigError(
                f"'{key}' asks to skip {m} layers, but this model has {n} decoder layers, "
                f"{protected} of them protected, and the draft keeps at least one: "
                f"at most {most} can be skipped."
            )


@dataclass(frozen=True)
class SelfSdOptions(DraftingOptions):
    """Options of method `self_sd` (Draft & Verify, Zhang et al., ACL 2024):
    a skip set searched offline (a profile) and the adaptive draft-exiting
    threshold of its Eq. 2-4 (defaults: Appendix B)."""

    profile: str | None = None
    """Path of a skip profile written by `vllm-layerskip search`, or "shipped"
    for the profile that ships with the plugin for this model."""
    draft_confidence_threshold: float = 0.6
    """gamma_0: the initial draft-exiting threshold (adapted while serving)."""
    adaptive_threshold: bool = True
    """Adapt the threshold to keep acceptance near `target_acceptance` (Eq. 2-4)."""
    target_acceptance: float = 0.85
    """alpha: the acceptance rate the threshold steers towards."""
    threshold_step: float = 0.01
    """epsilon: step of the threshold update."""
    acceptance_smoothing: float = 0.5
    """beta_1: AR <- beta_1 AR + (1 - beta_1) AR_e."""
    threshold_smoothing: float = 0.9
    """beta_2: gamma <- beta_2 gamma + (1 - beta_2) gamma~."""

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.profile, str) or not self.profile:
            raise LayerSkipConfigError(
                "Method 'self_sd' needs 'profile': the path of a skip profile from "
                "`vllm-layerskip search --model MODEL --out PROFILE.json`, or \"shipped\" "
                f"for the profile shipped for the model; got {self.profile!r}."
            )
        _check_bool("adaptive_threshold", self.adaptive_threshold)
        _check_number("target_acceptance", self.target_acceptance, 0.0, 1.0)
        _check_number("threshold_step", self.threshold_step, 0.0, 1.0)
        _check_number("acceptance_smoothing", self.acceptance_smoothing, 0.0, 1.0)
        _check_number("threshold_smoothing", self.threshold_smoothing, 0.0, 1.0)

    def validate_for_model(self, model: ModelIdentity) -> None:
        from vllm_layerskip.profiles import load_profile  # the format lives there

        load_profile(self.profile, model)


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
        _check_number("threshold", self.threshold, 0.0, 1.0)

    def validate_for_model(self, model: ModelIdentity) -> None:
        from vllm_layerskip.heads import load_heads  # the format lives there

        load_heads(self.heads, model)


def _check_number(key: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LayerSkipConfigError(
            f"'{key}' must be a number in [{low:g}, {high:g}], got {value!r}."
        )
    if not low <= value <= high:
        raise LayerSkipConfigError(
            f"'{key}' must be in [{low:g}, {high:g}], got {value}."
            + (" 0 disables it." if low == 0.0 else "")
        )


def _check_share(key: str, value: Any) -> None:
    """An optimizer's share of the engine's time: in (0, 1]."""
    _check_number(key, value, 0.0, 1.0)
    if value == 0:
        raise LayerSkipConfigError(
            f"'{key}' must be > 0 (the optimizer needs some time); to keep a set fixed "
            "use method 'layer_skip'."
        )


def _check_int(key: str, value: Any, minimum: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise LayerSkipConfigError(
            f"'{key}' must be {kind}{f' ({unit})' if unit else ''}, got {value!r}."
        )


def _check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise LayerSkipConfigError(f"'{key}' must be true or false, got {value!r}.")


OPTIONS_BY_METHOD: dict[str, type] = {
    "layer_skip": LayerSkipOptions,
    "swift": SwiftOptions,
    "self_sd": SelfSdOptions,
    "clasp": ClaspOptions,
    "adadecode": AdaDecodeOptions,
}


def is_layerskip_method(method: Any) -> bool:
    return method in AVAILABLE_METHODS or method in PLANNED_METHODS


def split_speculative_config(
    raw: dict[str, Any], vllm_keys: set[str]
) -> tuple[str, Any, dict[str, Any]]:
    """Split a user's speculative config into (method, our options, vLLM's keys).

    `vllm_keys` are the field names of vLLM's SpeculativeConfig.

    Raises LayerSkipConfigError for a planned-but-unavailable method, an unknown
    key, or a value out of range.
    """
    method = raw["method"]
    if method not in AVAILABLE_METHODS:
        raise LayerSkipConfigError(
            f"Speculative method '{method}' of vllm-layerskip is not available yet "
            f"in this version. Available layer-skip methods: "
            f"{', '.join(AVAILABLE_METHODS)}."
        )
    options_cls = OPTIONS_BY_METHOD[method]
    option_names = {f.name for f in dataclasses.fields(options_cls)}
    ours = {k: v for k, v in raw.items() if k in option_names}
    vllm_part = {k: v for k, v in raw.items() if k not in option_names}
    given_model_keys = sorted(set(vllm_part) & DRAFT_MODEL_KEYS)
    if given_model_keys:
        raise LayerSkipConfigError(
            f"Method '{method}' drafts with the target model itself; remove "
            f"{', '.join(repr(k) for k in given_model_keys)} from the speculative config."
        )
    unknown = sorted(set(vllm_part) - set(vllm_keys))
    if unknown:
        valid = sorted(option_names | {"method", "num_speculative_tokens"})
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, valid, n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        raise LayerSkipConfigError(
            f"Unknown key(s) in the speculative config for method '{method}': "
            f"{', '.join(hints)}. Valid keys: {', '.join(valid)} (and vLLM's own "
            "speculative-config keys)."
        )
    try:
        options = options_cls(**ours)
    except TypeError as e:  # pragma: no cover - keys were filtered above
        raise LayerSkipConfigError(str(e)) from e
    return method, options, vllm_part


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


def build_mask(options: LayerSkipOptions, num_layers: int) -> SkipMask:
    """The draft mask for a model with `num_layers` decoder layers, checked against it."""
    for key in ("skip_layers", "skip_attn", "skip_mlp"):
        bad = [i for i in getattr(options, key) if not 0 <= i < num_layers]
        if bad:
            raise LayerSkipConfigError(
                f"'{key}' has layer indices {bad} outside the model, which has "
                f"{num_layers} decoder layers (valid indices 0..{num_layers - 1})."
            )
    if options.skip_ratio is not None:
        skip_attn, skip_mlp = uniform_skip_sets(num_layers, options.skip_ratio)
    else:
        skip_attn = set(options.skip_layers) | set(options.skip_attn)
        skip_mlp = set(options.skip_layers) | set(options.skip_mlp)
    mask = SkipMask.from_sets(num_layers, skip_attn, skip_mlp)
    if mask.num_skipped == 2 * num_layers:
        raise LayerSkipConfigError(
            "The skip set skips every attention and MLP sub-layer, so the draft would "
            "not run the model at all. Keep at least one sub-layer."
        )
    return mask
