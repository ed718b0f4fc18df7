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

Heads serve the model they were trained for: same architecture, shapes and
weights (core/identity.py), whatever path the model is served from.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.core.versioned_file import FileKind

HEADS = FileKind(
    what="Exit heads file",
    format="vllm-layerskip/exit-heads",
    version=1,
    remedy="Train heads for this model with `vllm-layerskip train-heads --model MODEL "
           "--prompts FILE --layers 8,15,22 --out HEADS.safetensors`.",
    option="heads",
    suffix=".heads.safetensors",
    shipped_dir=Path(__file__).parent / "shipped",
)


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
            "format": HEADS.format,
            "version": str(HEADS.version),
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


def load_heads(heads: str, model: ModelIdentity) -> ExitHeads:
    """Load and check exit heads for the running model (a path, or "shipped");
    raise LayerSkipConfigError saying what is wrong (missing, not safetensors,
    wrong format or version, another model, shapes that do not fit, non-finite
    values)."""
    from safetensors import safe_open

    path = HEADS.resolve(heads, model)
    meta = HEADS.read_safetensors_metadata(path)
    try:
        recorded_model = json.loads(meta["model"])
        layers = [int(i) for i in json.loads(meta["layers"])]
        training = dict(json.loads(meta.get("training", "{}")))
        heldout_kl = dict(json.loads(meta.get("heldout_kl", "{}")))
    except (KeyError, TypeError, ValueError) as e:
        raise HEADS.refuse(path, f"is corrupt: missing or malformed metadata ({e!r})") from e
    saved = HEADS.saved_identity(path, recorded_model)
    HEADS.check_model(path, saved, model)
    if not layers or layers != sorted(set(layers)) or not all(0 < i < model.num_layers for i in layers):
        raise HEADS.refuse(
            path, f"is corrupt: layers {layers} are not distinct ascending indices in "
                  f"1..{model.num_layers - 1}"
        )
    with safe_open(str(path), framework="pt") as f:
        transforms = f.get_tensor("transforms") if "transforms" in set(f.keys()) else None
    d = model.hidden_size
    if transforms is None or tuple(transforms.shape) != (len(layers), d, d):
        shape = None if transforms is None else tuple(transforms.shape)
        raise HEADS.refuse(path, f"is corrupt: tensor 'transforms' has shape {shape}, expected "
                                 f"{(len(layers), d, d)} for layers {layers}")
    if not torch.isfinite(transforms).all():
        raise HEADS.refuse(path, "is corrupt: 'transforms' holds NaN or infinite values")
    return ExitHeads(
        model=saved, layers=layers, transforms=transforms, training=training,
        heldout_kl=heldout_kl, created=meta.get("created", ""), path=str(path),
    )
