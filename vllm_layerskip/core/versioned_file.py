"""Files the plugin reads at start-up for one model (skip profiles, exit heads,
SWIFT state, draft vocabularies): one loader for all of them.

Every such file carries a "format" name, a "version" and the identity of the
model it was made for (core/identity.py). `FileKind` describes one kind of file;
its methods find the file (`"shipped"` means the file shipped with the plugin for
the running model, found by identity, not by the model directory's name), read
and check it, and refuse it with one message shape everywhere:

    <What> '<path>' <problem>. <what to do>

The atomic writer is here too: readers (other engines, a restart) never see a
half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity

SHIPPED = "shipped"  # option value: the file shipped with the plugin for this model


@dataclass(frozen=True)
class FileKind:
    what: str  # how messages name it: "Skip profile", "Exit heads file", ...
    format: str  # the file's "format" value
    version: int  # the version this plugin reads and writes
    remedy: str  # what to do about a refused file (a full sentence)
    option: str  # the speculative-config key that names such a file
    suffix: str = ".json"
    shipped_dir: Path | None = None  # where shipped files of this kind live
    noun: str = ""  # "is not a <noun>"; default: `what` in lower case
    # What to do where no file is shipped for the running model (a full
    # sentence); default: the remedy, and to pass the made file's path.
    unshipped: str = ""

    def refuse(self, path, problem: str) -> LayerSkipConfigError:
        return LayerSkipConfigError(f"{self.what} '{path}' {problem}. {self.remedy}")

    # ---- finding the file ----------------------------------------------------

    def resolve(self, value: str, running: ModelIdentity) -> Path:
        """The path an option names; `"shipped"`: the shipped file made for the
        running model."""
        if value != SHIPPED:
            return Path(value).expanduser()
        shipped = self.shipped_files()
        for path in shipped:
            try:
                if not self.identity_in(path).differences(running):
                    return path
            except LayerSkipConfigError:
                continue  # a damaged shipped file serves no model
        names = sorted(p.name[: -len(self.suffix)] for p in shipped)
        remedy = self.unshipped or (
            f"{self.remedy.rstrip('.')}, and pass its path as '{self.option}'.")
        raise LayerSkipConfigError(
            f"No shipped {self.noun or self.what.lower()} for model '{running.name}' "
            f"(shipped for: {', '.join(names) or 'none'}). {remedy}"
        )

    def shipped_files(self) -> list[Path]:
        if self.shipped_dir is None or not self.shipped_dir.is_dir():
            return []
        return sorted(self.shipped_dir.glob(f"*{self.suffix}"))

    def identity_in(self, path: Path) -> ModelIdentity:
        """The model identity recorded in a file of this kind."""
        if self.suffix.endswith(".safetensors"):
            model = json.loads(self.read_safetensors_metadata(path).get("model", "null"))
        else:
            model = self.read_json(path).get("model")
        return self.saved_identity(path, model)

    # ---- reading and checking ------------------------------------------------

    def read_json(self, path: Path) -> dict:
        """The file's JSON object, checked for its format and version."""
        if not path.exists():
            raise self.refuse(path, "does not exist")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise self.refuse(path, f"cannot be read ({e})") from e
        except json.JSONDecodeError as e:
            raise self.refuse(path, f"is not valid JSON ({e})") from e
        if not isinstance(data, dict):
            data = {}
        self._check_format(path, data.get("format"), data.get("version"), self.version)
        return data

    def read_safetensors_metadata(self, path: Path) -> dict[str, str]:
        """A safetensors file's metadata, checked for its format and version
        (safetensors metadata holds strings only: the version is "1")."""
        from safetensors import safe_open

        if not path.exists():
            raise self.refuse(path, "does not exist")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
        except Exception as e:  # safetensors raises several types for a damaged file
            raise self.refuse(path, f"is not a readable safetensors file ({e})") from e
        self._check_format(path, meta.get("format"), meta.get("version"), str(self.version),
                           where=" in its metadata")
        return meta

    def _check_format(self, path, fmt, version, expected_version, where: str = "") -> None:
        if fmt != self.format:
            noun = self.noun or self.what.lower()
            article = "an" if noun[0] in "aeiou" else "a"
            raise self.refuse(path, f"is not {article} {noun} (no \"format\": "
                                    f"\"{self.format}\"{where})")
        if version != expected_version:
            raise self.refuse(path, f"has version {version!r}; this plugin reads version "
                                    f"{self.version}")

    def saved_identity(self, path, model: Any) -> ModelIdentity:
        """The identity a file records, or a refusal if it is malformed."""
        try:
            return ModelIdentity.from_dict(model)
        except (TypeError, ValueError) as e:
            raise self.refuse(path, f"is corrupt: malformed model identity ({e})") from e

    def check_model(self, path, saved: ModelIdentity, running: ModelIdentity) -> None:
        """Refuse a file made for another model than the running one."""
        diffs = saved.differences(running)
        if diffs:
            raise self.refuse(path, "was made for another model (" + "; ".join(diffs) + ")")


def write_json_atomic(path: str | os.PathLike, data: dict, durable: bool = True, **dump) -> None:
    """Write to a temporary file in the same directory, then rename it over
    `path`: readers never see a half-written file. `durable`: fsync before the
    rename, so a crash keeps the old or the new file (a status file rewritten
    every step does without: its reader sees the last step's or the one before)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, **dump)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
