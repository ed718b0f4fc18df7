"""Versioned JSON files the plugin reads at start-up and rewrites while running
(SWIFT state, skip profiles): one reader that turns every problem into a clear
error, one atomic writer."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable


def read_versioned_json(
    path: Path, fmt: str, version: int, what: str, refuse: Callable[[Path, str], Exception]
) -> dict:
    """The file's JSON object, checked for its "format" and "version" keys;
    `refuse(path, problem)` builds the exception raised otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise refuse(path, f"cannot be read ({e})") from e
    except json.JSONDecodeError as e:
        raise refuse(path, f"is not valid JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise refuse(path, f"is not {what} (no \"format\": \"{fmt}\")")
    if data.get("version") != version:
        raise refuse(path, f"has version {data.get('version')!r}; this plugin reads version {version}")
    return data


def write_json_atomic(path: str | os.PathLike, data: dict) -> None:
    """Write to a temporary file in the same directory, then rename it over
    `path`: readers (other engines, a restart) never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
