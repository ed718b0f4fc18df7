"""Skip-set profiles: the result of an offline search (`vllm-layerskip search`),
loaded by method `self_sd`.

    {
      "format": "vllm-layerskip/skip-profile", "version": 1,
      "model": {model, architecture, num_layers, hidden_size, vocab_size},
      "skip_attn": [...], "skip_mlp": [...],
      "objective": {"name": "speed" | "proxy", "value": ..., "higher_is_better": true, ...},
      "search": {iterations, prompts, seed, ..., "command": "..."},
      "created": "2026-11-22T05:40:00"
    }

A profile serves the model it was searched for: same architecture, shapes and
weights (core/identity.py), whatever path the model is served from. A profile
found for one checkpoint says nothing about another one with the same shapes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.versioned_file import FileKind, write_json_atomic

PROFILE = FileKind(
    what="Skip profile",
    format="vllm-layerskip/skip-profile",
    version=1,
    remedy="Create one for this model with "
           "`vllm-layerskip search --model MODEL --out PROFILE.json`.",
    option="profile",
    shipped_dir=Path(__file__).parent / "shipped",
)


@dataclass
class SkipProfile:
    model: ModelIdentity
    skip_attn: list[int]
    skip_mlp: list[int]
    objective: dict
    search: dict
    created: str = ""
    path: str = ""

    @property
    def num_skipped(self) -> int:
        return len(self.skip_attn) + len(self.skip_mlp)

    def to_json(self) -> dict:
        return {
            "format": PROFILE.format,
            "version": PROFILE.version,
            "model": self.model.as_dict(),
            "skip_attn": sorted(self.skip_attn),
            "skip_mlp": sorted(self.skip_mlp),
            "objective": self.objective,
            "search": self.search,
            "created": self.created,
        }


def load_profile(profile: str, model: ModelIdentity) -> SkipProfile:
    """Load and check a profile for the running model (a path, or "shipped");
    raise LayerSkipConfigError saying what is wrong (missing, not JSON, wrong
    format, another model, bad sets)."""
    path = PROFILE.resolve(profile, model)
    data = PROFILE.read_json(path)
    saved = PROFILE.saved_identity(path, data.get("model"))
    try:
        prof = SkipProfile(
            model=saved,
            skip_attn=[_index(i) for i in data["skip_attn"]],
            skip_mlp=[_index(i) for i in data["skip_mlp"]],
            objective=dict(data["objective"]),
            search=dict(data.get("search", {})),
            created=str(data.get("created", "")),
            path=str(path),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PROFILE.refuse(path, f"is corrupt: missing or malformed field ({e!r})") from e
    PROFILE.check_model(path, saved, model)
    bad = [i for i in prof.skip_attn + prof.skip_mlp if not 0 <= i < model.num_layers]
    if bad:
        raise PROFILE.refuse(path, f"is corrupt: layer indices {bad} outside 0..{model.num_layers - 1}")
    if prof.num_skipped == 0 or prof.num_skipped >= 2 * model.num_layers:
        raise PROFILE.refuse(path, f"skips {prof.num_skipped} of {2 * model.num_layers} sub-layers: "
                                   "nothing to draft with")
    return prof


def _index(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"layer index {value!r} is not an integer")
    return value


def save_profile(path: str | os.PathLike, profile: SkipProfile) -> None:
    write_json_atomic(path, profile.to_json())
