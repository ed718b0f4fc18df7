"""What a model *is*, for files made for one model (skip profiles, exit heads,
SWIFT state, draft vocabularies): its architecture, shapes and a fingerprint of a
few weight slices. Not the directory's name: the same weights served from another
path or hub id are the same model, and another model of the same shape is not.

The fingerprint hashes a few rows of the embedding and of the last layer's MLP
down-projection, rounded to bfloat16 so that a float32 and a bfloat16 copy of one
checkpoint agree. It reads slices out of the safetensors files (milliseconds,
not the weights); where there are none (a hub id not downloaded yet, .bin
weights) it is None, and files are then matched by the model's name instead,
the rule of plugin versions that recorded no fingerprint.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

# Columns read per sampled row: enough to tell checkpoints apart, few bytes.
_FINGERPRINT_COLUMNS = 256


@dataclass(frozen=True)
class ModelIdentity:
    model: str  # the path or hub id it was seen under: a label, not compared when fingerprints exist
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    fingerprint: str | None = None  # weights_fingerprint(); None: not known

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelIdentity":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown model identity keys {sorted(unknown)}")
        return cls(**data)

    @property
    def name(self) -> str:
        """The last part of the path or hub id."""
        return os.path.basename(str(self.model).rstrip("/"))

    def differences(self, running: "ModelIdentity") -> list[str]:
        """Why a file made for this model (self) cannot serve `running`, as
        "what: file X vs running Y" items; empty if it can."""
        diffs = [
            f"{k}: file {getattr(self, k)!r} vs running {getattr(running, k)!r}"
            for k in ("architecture", "num_layers", "hidden_size", "vocab_size")
            if getattr(self, k) != getattr(running, k)
        ]
        if self.fingerprint and running.fingerprint:
            if self.fingerprint != running.fingerprint:
                diffs.append(
                    f"weights: file {self.fingerprint} vs running {running.fingerprint} "
                    f"(other weights; file made for '{self.name}', running '{running.name}')"
                )
        elif self.name != running.name:
            diffs.append(f"model: file {self.name!r} vs running {running.name!r} "
                         "(no weight fingerprint to compare)")
        return diffs


def model_identity(model_config) -> ModelIdentity:
    """The running model (a vLLM ModelConfig) as files record it."""
    text = model_config.hf_text_config
    return ModelIdentity(
        model=str(model_config.model),
        architecture=(list(model_config.architectures or []) or ["unknown"])[0],
        num_layers=int(text.num_hidden_layers),
        hidden_size=int(text.hidden_size),
        vocab_size=int(model_config.get_vocab_size()),
        fingerprint=weights_fingerprint(str(model_config.model)),
    )


def checkpoint_identity(model_dir: str) -> ModelIdentity:
    """A Hugging Face checkpoint directory's identity, from its config.json
    (for offline tools that do not build a vLLM engine)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    return ModelIdentity(
        model=str(model_dir),
        architecture=(cfg.get("architectures") or ["unknown"])[0],
        num_layers=int(text["num_hidden_layers"]),
        hidden_size=int(text["hidden_size"]),
        vocab_size=int(text["vocab_size"]),
        fingerprint=weights_fingerprint(model_dir),
    )


@functools.lru_cache(maxsize=16)
def weights_fingerprint(model: str) -> str | None:
    """16 hex digits identifying the weights of the checkpoint at `model` (a
    directory, or a hub id already in the local cache); None if its weights are
    not readable as safetensors here."""
    files = _safetensors_files(model)
    if not files:
        return None
    try:
        from safetensors import safe_open

        where = {}  # tensor name -> file
        for path in files:
            with safe_open(path, framework="pt") as f:
                where.update((name, path) for name in f.keys())
        picked = _fingerprint_tensors(where)
        if not picked:
            return None
        digest = hashlib.sha256()
        for name in picked:
            with safe_open(where[name], framework="pt") as f:
                digest.update(name.encode())
                digest.update(_sample_rows(f.get_slice(name)))
        return digest.hexdigest()[:16]
    except Exception:  # noqa: BLE001 - an unreadable file: no fingerprint, name rule applies
        return None


def _fingerprint_tensors(names) -> list[str]:
    """The embedding and the last decoder layer's MLP down-projection, whatever
    the sharding of the files."""
    embed = sorted(n for n in names if n.endswith("embed_tokens.weight"))
    down = [n for n in names if n.endswith("mlp.down_proj.weight") and "layers." in n]
    last = max(down, key=lambda n: int(n.split("layers.")[1].split(".")[0]), default=None)
    return embed + ([last] if last else [])


def _safetensors_files(model: str) -> list[str]:
    if os.path.isdir(model):
        return sorted(glob.glob(os.path.join(model, "*.safetensors")))
    try:  # a hub id: only what is already cached, never a download
        from huggingface_hub import snapshot_download

        local = snapshot_download(model, local_files_only=True, allow_patterns=["*.safetensors"])
    except Exception:  # noqa: BLE001 - not cached, no hub library, not a hub id
        return []
    return sorted(glob.glob(os.path.join(local, "*.safetensors")))


def _sample_rows(tensor_slice) -> bytes:
    import torch

    rows = tensor_slice.get_shape()[0]
    picks = sorted({0, 1, rows // 2, rows - 1})
    parts = [tensor_slice[r:r + 1, :_FINGERPRINT_COLUMNS] for r in picks]
    sample = torch.cat(parts).to(torch.bfloat16).to(torch.float32)
    return sample.numpy().tobytes()
