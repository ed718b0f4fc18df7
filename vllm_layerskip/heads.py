"""Exit heads for method `adadecode`: the file format and its loader.

An exit head at layer i is a d x d matrix T(i). It reads the residual stream
h_i after the first i decoder layers and predicts the next token with the
model's own final norm and LM head (E*, frozen):

    p_i(t | h_i) = softmax(E*(T(i) h_i))

`vllm-layerskip train-heads` (heads_training.py) fits T(i), initialised to the
identity, so that p_i matches the final layer's distribution (KL). Identity
heads are plain early exit with the original LM head.

The file is safetensors: one tensor "transforms" [num_heads, d, d] (fp16),
row h of it the head at layers[h]; and string metadata (safetensors allows only
strings, so structured values are JSON):

    format "vllm-layerskip/exit-heads", version "1",
    model      {model, architecture, num_layers, hidden_size, vocab_size},
    layers     [8, 15, 22],
    training   {prompts, steps, lr, seconds, command, ...},
    heldout_kl {"before": [...], "after": [...]}   (per layer, nats/token),
    created    ISO time

Heads match a running model as skip profiles do (profiles.py): same
architecture, shapes and model name.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vllm_layerskip.options import LayerSkipConfigError, ModelIdentity
from vllm_layerskip.profiles import SHIPPED_DIR, model_name, resolve_shipped

HEADS_FORMAT = "vllm-layerskip/exit-heads"
HEADS_VERSION = 1
HEADS_SUFFIX = ".heads.safetensors"


@dataclass
class ExitHeads:
    model: ModelIdentity
    layers: list[int]  # [num_heads] ascending: head h reads h_{layers[h]}
    transforms: torch.Tensor  # [num_heads, hidden, hidden] T(i), applied as T @ h
    training: dict = field(default_factory=dict)
    heldout_kl: dict = field(default_factory=dict)  # {"before": [...], "after": [...]}
    created: str = ""
    path: str = ""

    @classmethod
    def identity(cls, model: ModelIdentity, layers: list[int]) -> "ExitHeads":
        """Untrained heads: early exit through the original LM head."""
        eye = torch.eye(model.hidden_size).expand(len(layers), -1, -1).clone()
        return cls(model=model, layers=sorted(layers), transforms=eye)

    def metadata(self) -> dict[str, str]:
        return {
            "format": HEADS_FORMAT,
            "version": str(HEADS_VERSION),
            "model": json.dumps(self.model.as_dict()),
            "layers": json.dumps(self.layers),
            "training": json.dumps(self.training),
            "heldout_kl": json.dumps(self.heldout_kl),
            "created": self.created or time.strftime("%Y-%m-%dT%H:%M:%S"),
        }


def save_heads(path: str | Path, heads: ExitHeads, dtype=torch.float16) -> None:
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(
        {"transforms": heads.transforms.detach().to(dtype).contiguous()},
        str(tmp),
        metadata=heads.metadata(),
    )
    tmp.replace(path)  # readers never see a half-written file


def shipped_heads_path(model: ModelIdentity) -> Path:
    return SHIPPED_DIR / f"{model_name(model.model)}{HEADS_SUFFIX}"


def _refuse(path, what: str) -> LayerSkipConfigError:
    return LayerSkipConfigError(
        f"Exit heads file '{path}' {what}. Train heads for this model with "
        "`vllm-layerskip train-heads --model MODEL --prompts FILE --layers 8,15,22 "
        "--out HEADS.safetensors`."
    )


def resolve_heads_path(heads: str, model: ModelIdentity) -> Path:
    return resolve_shipped(
        heads, model, HEADS_SUFFIX, "exit heads",
        "Train some with `vllm-layerskip train-heads --model MODEL --prompts FILE --layers "
        "8,15,22 --out HEADS.safetensors`", "heads",
    )


def load_heads(heads: str, model: ModelIdentity) -> ExitHeads:
    """Load and check exit heads for the running model; raise LayerSkipConfigError
    saying what is wrong (missing, not safetensors, wrong format or version,
    another model, shapes that do not fit, non-finite values)."""
    from safetensors import safe_open

    path = resolve_heads_path(heads, model)
    if not path.exists():
        raise _refuse(path, "does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            names = set(f.keys())
            transforms = f.get_tensor("transforms") if "transforms" in names else None
    except Exception as e:  # safetensors raises several types for a damaged file
        raise _refuse(path, f"is not a readable safetensors file ({e})") from e
    if meta.get("format") != HEADS_FORMAT:
        raise _refuse(path, f'is not an exit heads file (no "format": "{HEADS_FORMAT}" in its metadata)')
    if meta.get("version") != str(HEADS_VERSION):
        raise _refuse(path, f"has version {meta.get('version')!r}; this plugin reads version {HEADS_VERSION}")
    try:
        saved = ModelIdentity(**json.loads(meta["model"]))
        layers = [int(i) for i in json.loads(meta["layers"])]
        training = dict(json.loads(meta.get("training", "{}")))
        heldout_kl = dict(json.loads(meta.get("heldout_kl", "{}")))
    except (KeyError, TypeError, ValueError) as e:
        raise _refuse(path, f"is corrupt: missing or malformed metadata ({e!r})") from e
    diffs = saved.differences(model, "heads")
    if diffs:
        raise _refuse(path, "was trained for another model (" + "; ".join(diffs) + ")")
    if not layers or layers != sorted(set(layers)) or not all(0 < i < model.num_layers for i in layers):
        raise _refuse(
            path, f"is corrupt: layers {layers} are not distinct ascending indices in "
                  f"1..{model.num_layers - 1}"
        )
    d = model.hidden_size
    if transforms is None or tuple(transforms.shape) != (len(layers), d, d):
        shape = None if transforms is None else tuple(transforms.shape)
        raise _refuse(path, f"is corrupt: tensor 'transforms' has shape {shape}, expected "
                            f"{(len(layers), d, d)} for layers {layers}")
    if not torch.isfinite(transforms).all():
        raise _refuse(path, "is corrupt: 'transforms' holds NaN or infinite values")
    return ExitHeads(
        model=saved, layers=layers, transforms=transforms, training=training,
        heldout_kl=heldout_kl, created=meta.get("created", ""), path=str(path),
    )
