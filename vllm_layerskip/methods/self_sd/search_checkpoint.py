"""The checkpoint of Self-SD's offline search (`OUT.search.json`, next to the
profile): every evaluation so far and the settings they were made with, so
that a later run with the same settings resumes from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vllm_layerskip.core.errors import LayerSkipConfigError

CHECKPOINT_FORMAT = "vllm-layerskip/search-checkpoint"


def load_checkpoint(path: Path, settings: dict) -> list[dict]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
        assert data["format"] == CHECKPOINT_FORMAT
        history = list(data["history"])
    except Exception as e:  # noqa: BLE001 - any corruption gets the same advice
        raise LayerSkipConfigError(
            f"Search checkpoint {path} is corrupt ({e!r}); delete it or use --no-resume."
        ) from e
    if data.get("settings") != settings:
        raise LayerSkipConfigError(
            f"Search checkpoint {path} was written with other settings "
            f"({data.get('settings')} vs {settings}); use the same settings, another "
            "--out, or --no-resume."
        )
    return history


def save_checkpoint(path: Path, settings: dict, history: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"format": CHECKPOINT_FORMAT, "settings": settings,
                               "history": history}, indent=1))
    os.replace(tmp, path)
