"""SmolLM2 with an identity layer after each of its layers: a model on which a
fixed draft length beats plain decoding on this CPU.

Issue 8's second target ("where a fixed draft length beats plain decoding, the
cost model keeps 95% of that speedup") needs such a case, and SmolLM2 itself
has none here: every skip set of its 30 layers either loses too much
acceptance or saves too little of a step. The padded model has 60 layers; the
odd ones have their attention and MLP output projections (o_proj, down_proj)
set to zero, so they add exactly 0.0 to the residual stream and the model's
outputs are SmolLM2's, at twice the cost per token. Skipping the odd layers
gives a draft that computes SmolLM2 itself, at about half a step: every draft
token is accepted (up to float32 rounding between a decode and a verify pass).
It is a sanity configuration, like the no-skip one, not a claim about SmolLM2.
"""

from __future__ import annotations

import json
import os
import shutil

NAME = "identity-padded"  # bench_methods.py --model identity-padded
_MARKER = ".complete"
_ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def identity_layers(num_base_layers: int) -> list[int]:
    """Indices of the inserted layers: one after each base layer."""
    return [2 * i + 1 for i in range(num_base_layers)]


def ensure_padded_model(base_dir: str) -> str:
    """The padded checkpoint next to `base_dir` (built once, then cached)."""
    out = base_dir.rstrip("/") + f"-{NAME}"
    if os.path.isfile(os.path.join(out, _MARKER)):
        return out
    from safetensors.torch import load_file, save_file

    with open(os.path.join(base_dir, "config.json")) as f:
        config = json.load(f)
    num_base = config["num_hidden_layers"]
    weights = load_file(os.path.join(base_dir, "model.safetensors"))
    padded = {}
    for name, tensor in weights.items():
        if not name.startswith("model.layers."):
            padded[name] = tensor
            continue
        index, rest = name[len("model.layers."):].split(".", 1)
        padded[f"model.layers.{2 * int(index)}.{rest}"] = tensor
        copy = tensor.clone()
        if rest in _ZEROED:
            copy.zero_()
        padded[f"model.layers.{2 * int(index) + 1}.{rest}"] = copy
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base_dir, tmp, ignore=shutil.ignore_patterns("model.safetensors", _MARKER))
    save_file(padded, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump({**config, "num_hidden_layers": 2 * num_base}, f, indent=2)
    open(os.path.join(tmp, _MARKER), "w").close()
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
