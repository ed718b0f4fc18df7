"""What every method's options share: the drafting keys, and the checks that turn
a bad value into a message naming the key, the value and what is accepted.

Each method declares its own frozen dataclass of options (methods/<name>/options.py)
on top of `DraftingOptions`; the registry (methods/registry.py) takes the method's
keys out of the user's `--speculative-config` and builds it."""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity


# Prompt lookup on by default, as (max, min) n-gram: on Qwen2.5-Coder-1.5B it
# drafted most of what any method gained (benchmarks/RESULTS.md); 2..4, as
# vLLM's benchmarks use for its ngram method.
DEFAULT_PROMPT_LOOKUP = (4, 2)
# Where copied drafts come from (core/lookup.py, core/suffix_copies.py).
COPY_SOURCES = ("prompt_lookup", "suffix_tree")


@dataclass(frozen=True)
class DraftingOptions:
    """Options every layer-skip method has."""

    # Old or removed keys a method still reads for one release (with a warning),
    # each with its new name (None: removed): not listed among the valid keys; a
    # typo of one is pointed to the new name.
    DEPRECATED_KEYS: ClassVar[dict[str, str | None]] = {}

    draft_confidence_threshold: float = 0.0
    """Stop a request's draft once the draft's top-1 probability is below this."""
    adaptive_draft_length: bool = True
    """Choose each step's draft length (0 = no drafting) from measured costs and
    acceptance, so speculation never makes decoding slower (core/cost_model.py)."""
    probe_interval: int = 16
    """While drafting does not pay: steps between probes (doubling up to 512)."""
    draft_vocab_size: int | None = None
    """The draft scores only this many token ids, the first of the ranking
    `draft_vocab` names (core/draft_head.py); 0: the whole vocabulary; unset:
    the vocabulary shipped for the model at its size when there is one, else
    the whole vocabulary. Verification always uses the whole vocabulary."""
    draft_vocab: str | None = None
    """A draft vocabulary file (`vllm-layerskip draft-vocab`), or "shipped" for
    the one shipped for the model. Without `draft_vocab_size`, the draft scores
    as many ids as the file was made for."""

    draft_weights: str | None = None
    """Draft passes read the decoder's linear weights quantized, "int4" or
    "w8a8" (int8 weights and activations, for passes of many tokens): a copy
    made at load (core/draft_weights.py), verification keeps the model's own
    weights. Unset: drafts read the model's weights. CPU only. ("int8",
    weight-only, is deprecated: it never paid.)"""
    draft_weights_grid: str | None = None
    """How "int4" draft weights pick each group's step: "auto" (the default) keeps
    the 4-bit grid of a checkpoint dequantized from 4 bits (a GGUF Q4_K) where a
    sample of a weight's groups shows one, and (max - min) / 15 elsewhere;
    "minmax": (max - min) / 15 everywhere. Only with "draft_weights": "int4"."""

    prompt_lookup_max: int | None = None
    """vLLM's key: drafts copied from the request's context where its last
    n <= prompt_lookup_max tokens occurred before (core/lookup.py), for the
    requests that have such a match; the others draft with the method. 0 turns
    it off; unset (and prompt_lookup_min unset): 4."""
    prompt_lookup_min: int | None = None
    """vLLM's key: the shortest n-gram that counts as a match (unset: as
    prompt_lookup_max, as in vLLM's ngram method; both unset: 2)."""
    copy_source: str = "prompt_lookup"
    """Where copied drafts come from: "prompt_lookup" (the request's context,
    n-grams of prompt_lookup_min..max tokens) or "suffix_tree" (suffix trees
    over the request's context and earlier requests' outputs, matches of up to
    24 tokens; needs scripts/install_suffix.sh; core/suffix_copies.py)."""

    def __post_init__(self):
        check_number("draft_confidence_threshold", self.draft_confidence_threshold, 0.0, 1.0)
        self._check_prompt_lookup()
        self._check_draft_weights()
        check_bool("adaptive_draft_length", self.adaptive_draft_length)
        check_int("probe_interval", self.probe_interval, minimum=1, unit="steps")
        if self.draft_vocab_size is not None:
            check_int("draft_vocab_size", self.draft_vocab_size, minimum=0, unit="token ids")
        if self.draft_vocab is not None and (not isinstance(self.draft_vocab, str) or not self.draft_vocab):
            raise LayerSkipConfigError(
                f"'draft_vocab' must be \"shipped\" or the path of a draft vocabulary file, "
                f"got {self.draft_vocab!r}."
            )

    def _check_draft_weights(self) -> None:
        from vllm_layerskip.core.draft_weights import DEPRECATED_SCHEMES, SCHEMES

        value = self.draft_weights
        if value in DEPRECATED_SCHEMES:
            logging.getLogger("vllm.layerskip").warning(
                "vllm-layerskip: 'draft_weights': %r is deprecated (weight-only 8 bits was "
                "slower than \"int4\" at 1-4 tokens a pass and than \"w8a8\" at more); use "
                "\"int4\" for one request at a time or \"w8a8\" for many. The next release "
                "refuses %r.", value, value)
        elif value is not None and value not in SCHEMES:
            close = difflib.get_close_matches(str(value).lower(), SCHEMES, n=1)
            hint = f" (did you mean \"{close[0]}\"?)" if close else ""
            raise LayerSkipConfigError(
                f"'draft_weights' must be one of {', '.join(repr(s) for s in SCHEMES)}, got "
                f"{value!r}{hint}; leave it out for the model's own weights.")
        self._check_draft_weights_grid()

    def _check_draft_weights_grid(self) -> None:
        from vllm_layerskip.core.draft_weights import GRIDS

        value = self.draft_weights_grid
        if value is None:
            return
        if value not in GRIDS:
            close = difflib.get_close_matches(str(value).lower(), GRIDS, n=1)
            hint = f" (did you mean \"{close[0]}\"?)" if close else ""
            raise LayerSkipConfigError(
                f"'draft_weights_grid' must be one of {', '.join(repr(g) for g in GRIDS)}, got "
                f"{value!r}{hint}: \"auto\" keeps a 4-bit checkpoint's own grid, \"minmax\" "
                "takes each group's (max - min) / 15.")
        if self.draft_weights is None:
            raise LayerSkipConfigError(
                f"'draft_weights_grid': {value!r} applies to int4 draft weights, and none are "
                "asked for: add \"draft_weights\": \"int4\", or remove 'draft_weights_grid'.")
        if self.draft_weights != "int4":
            raise LayerSkipConfigError(
                f"'draft_weights_grid' applies to \"draft_weights\": \"int4\" only; "
                f"{self.draft_weights!r} has one symmetric scale a row, no grid to choose. "
                "Remove 'draft_weights_grid', or use \"draft_weights\": \"int4\".")

    @property
    def int4_grid(self) -> str:
        """The grid "int4" draft weights are made with (draft_weights_grid's default: "auto")."""
        from vllm_layerskip.core.draft_weights import DEFAULT_GRID

        return self.draft_weights_grid or DEFAULT_GRID

    def _check_copy_source(self) -> None:
        from vllm_layerskip.core.suffix_copies import INSTALL_HINT, suffix_tree_available

        value = self.copy_source
        if value not in COPY_SOURCES:
            close = difflib.get_close_matches(str(value).lower(), COPY_SOURCES, n=1)
            hint = f" (did you mean \"{close[0]}\"?)" if close else ""
            raise LayerSkipConfigError(
                f"'copy_source' must be one of {', '.join(repr(s) for s in COPY_SOURCES)}, "
                f"got {value!r}{hint}.")
        if value != "suffix_tree":
            return
        given = [k for k in ("prompt_lookup_max", "prompt_lookup_min") if getattr(self, k) is not None]
        if given:
            raise LayerSkipConfigError(
                f"{' and '.join(repr(k) for k in given)} {'set' if len(given) > 1 else 'sets'} "
                "prompt lookup's n-grams, which "
                "\"copy_source\": \"suffix_tree\" does not use (its matches are up to 24 tokens): "
                "remove it, or use \"copy_source\": \"prompt_lookup\".")
        if not suffix_tree_available():
            raise LayerSkipConfigError(f"'copy_source': 'suffix_tree': {INSTALL_HINT}.")
        object.__setattr__(self, "prompt_lookup_max", 0)
        object.__setattr__(self, "prompt_lookup_min", 0)

    def _check_prompt_lookup(self) -> None:
        self._check_copy_source()
        if self.copy_source == "suffix_tree":
            return
        high, low = self.prompt_lookup_max, self.prompt_lookup_min
        if high is None and low is None:  # the default: on
            high, low = DEFAULT_PROMPT_LOOKUP
        for key, value in (("prompt_lookup_max", high), ("prompt_lookup_min", low)):
            if value is not None:
                check_int(key, value, minimum=0, unit="tokens")
        high = low if high is None else high
        low = high if low is None else low
        if high and not low:
            raise LayerSkipConfigError(
                "'prompt_lookup_min' must be at least 1 when 'prompt_lookup_max' is set "
                f"(got {self.prompt_lookup_min}).")
        if low and not high:
            raise LayerSkipConfigError(
                f"'prompt_lookup_min' {low} needs 'prompt_lookup_max' (0 turns lookup off).")
        if (high or 0) < (low or 0):
            raise LayerSkipConfigError(
                f"'prompt_lookup_min' ({low}) must be <= 'prompt_lookup_max' ({high}).")
        object.__setattr__(self, "prompt_lookup_max", high or 0)
        object.__setattr__(self, "prompt_lookup_min", low or 0)

    def draft_token_ids(self, model: ModelIdentity):
        """The pruned draft vocabulary ([V_sub] ids), or None for the whole one."""
        from vllm_layerskip.core.draft_vocab import draft_token_ids, shipped_for

        size = self.draft_vocab_size
        if size == 0:
            return None
        if self.draft_vocab is None and size is None:  # the default: shipped, if any
            return None if shipped_for(model) is None else draft_token_ids("shipped", 0, model)
        return draft_token_ids(self.draft_vocab or "shipped", size or 0, model)

    def validate_for_model(self, model: ModelIdentity) -> None:
        """Raise LayerSkipConfigError if the options cannot apply to this model.
        Subclasses that override it call this one."""
        self.draft_token_ids(model)
        if self.draft_weights is not None:
            from vllm.platforms import current_platform

            if not current_platform.is_cpu():
                raise LayerSkipConfigError(
                    f"'draft_weights': {self.draft_weights!r} runs on CPU only (torch's "
                    "quantized CPU kernels); remove the key on this platform.")

    def validate_for_parallelism(self, tensor_parallel_size: int) -> None:
        """Raise LayerSkipConfigError if the options cannot apply to this layout."""


def check_number(key: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LayerSkipConfigError(
            f"'{key}' must be a number in [{low:g}, {high:g}], got {value!r}."
        )
    if not low <= value <= high:
        raise LayerSkipConfigError(
            f"'{key}' must be in [{low:g}, {high:g}], got {value}."
            + (" 0 disables it." if low == 0.0 else "")
        )


def check_share(key: str, value: Any) -> None:
    """An optimizer's share of the engine's time: in (0, 1]."""
    check_number(key, value, 0.0, 1.0)
    if value == 0:
        raise LayerSkipConfigError(
            f"'{key}' must be > 0 (the optimizer needs some time); to keep a set fixed "
            "use method 'layer_skip'."
        )


def check_int(key: str, value: Any, minimum: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise LayerSkipConfigError(
            f"'{key}' must be {kind}{f' ({unit})' if unit else ''}, got {value!r}."
        )


def check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise LayerSkipConfigError(f"'{key}' must be true or false, got {value!r}.")


def check_layer_list(key: str, values: Any) -> tuple[int, ...]:
    """A list of layer indices, as a sorted tuple without repeats."""
    if not isinstance(values, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise LayerSkipConfigError(
            f"'{key}' must be a list of layer indices (integers), got {values!r}."
        )
    return tuple(sorted(set(values)))


def take_renamed_key(options, method: str, old: str, new: str, unit: str) -> None:
    """Read a key under its old name (for one release, with a warning that names
    the new one) into its new field of a frozen options object; both given is an
    error. `unit` says what the new name's value is a share of."""
    value = getattr(options, old)
    if value is None:
        return
    if getattr(options, new) is not None:
        raise LayerSkipConfigError(
            f"'{old}' is the old name of '{new}' for method '{method}'; give only '{new}'.")
    logging.getLogger("vllm.layerskip").warning(
        "vllm-layerskip %s: '%s' is now '%s' (%s). Rename it in the speculative config; "
        "the next release refuses '%s'.", method, old, new, unit, old)
    object.__setattr__(options, new, value)
    object.__setattr__(options, old, None)
