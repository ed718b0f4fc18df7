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

A profile matches a running model when the architecture and shapes agree and the
model's name (the last part of its path or hub id) is the same: a profile found
for one checkpoint says nothing about another one with the same shapes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vllm_layerskip.jsonfile import read_versioned_json, write_json_atomic
from vllm_layerskip.options import LayerSkipConfigError, ModelIdentity

PROFILE_FORMAT = "vllm-layerskip/skip-profile"
PROFILE_VERSION = 1
SHIPPED_DIR = Path(__file__).parent / "profiles"
SHIPPED = "shipped"  # `"profile": "shipped"`: the profile that ships for this model


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
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "model": self.model.as_dict(),
            "skip_attn": sorted(self.skip_attn),
            "skip_mlp": sorted(self.skip_mlp),
            "objective": self.objective,
            "search": self.search,
            "created": self.created,
        }


def model_name(model: str) -> str:
    return os.path.basename(str(model).rstrip("/"))


def shipped_profile_path(model: ModelIdentity) -> Path:
    return SHIPPED_DIR / f"{model_name(model.model)}.json"


def resolve_shipped(value: str, model: ModelIdentity, suffix: str, what: str, how: str,
                    key: str) -> Path:
    """The path a file option names: `"shipped"` is the file that ships with the
    plugin for this model (SHIPPED_DIR/<model name><suffix>), anything else a path.
    `what` names the kind of file, `how` says how to make one, `key` the option."""
    if value != SHIPPED:
        return Path(value).expanduser()
    path = SHIPPED_DIR / f"{model_name(model.model)}{suffix}"
    if not path.exists():
        shipped = sorted(p.name[: -len(suffix)] for p in SHIPPED_DIR.glob(f"*{suffix}"))
        raise LayerSkipConfigError(
            f"No shipped {what} for model '{model_name(model.model)}' (shipped: "
            f"{', '.join(shipped) or 'none'}). {how} and pass its path as '{key}'."
        )
    return path


def _refuse(path, what: str) -> LayerSkipConfigError:
    return LayerSkipConfigError(
        f"Skip profile '{path}' {what}. Create one for this model with "
        "`vllm-layerskip search --model MODEL --out PROFILE.json`."
    )


def resolve_profile_path(profile: str, model: ModelIdentity) -> Path:
    return resolve_shipped(
        profile, model, ".json", "skip profile",
        "Create one with `vllm-layerskip search --model MODEL --out PROFILE.json`", "profile",
    )


def load_profile(profile: str, model: ModelIdentity) -> SkipProfile:
    """Load and check a profile for the running model; raise LayerSkipConfigError
    with what is wrong (missing, not JSON, wrong format, other model, bad sets)."""
    path = resolve_profile_path(profile, model)
    if not path.exists():
        raise _refuse(path, "does not exist")
    data = read_versioned_json(path, PROFILE_FORMAT, PROFILE_VERSION, "a skip profile", _refuse)
    try:
        saved = ModelIdentity(**data["model"])
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
        raise _refuse(path, f"is corrupt: missing or malformed field ({e!r})") from e
    diffs = saved.differences(model, "profile")
    if diffs:
        raise _refuse(path, "was searched for another model (" + "; ".join(diffs) + ")")
    bad = [i for i in prof.skip_attn + prof.skip_mlp if not 0 <= i < model.num_layers]
    if bad:
        raise _refuse(path, f"is corrupt: layer indices {bad} outside 0..{model.num_layers - 1}")
    if prof.num_skipped == 0 or prof.num_skipped >= 2 * model.num_layers:
        raise _refuse(path, f"skips {prof.num_skipped} of {2 * model.num_layers} sub-layers: "
                            "nothing to draft with")
    return prof


def _index(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"layer index {value!r} is not an integer")
    return value


def save_profile(path: str | os.PathLike, profile: SkipProfile) -> None:
    write_json_atomic(path, profile.to_json())
