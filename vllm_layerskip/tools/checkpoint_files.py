"""The files of a Hugging Face checkpoint, written by hand: bf16 safetensors
shards (and their index) filled tensor by tensor from a GGUF file, so that a
tensor never has to be in memory whole, the JSON files, and the shapes read
back from the shards' headers."""

from __future__ import annotations

import json
import os
import time
from typing import Sequence

from vllm_layerskip.tools.gguf_parts import _GB, Log
from vllm_layerskip.tools.gguf_tensors import PlannedTensor, dequantized_rows

SHARD_BYTES = 1 << 30  # ~1 GB shards, like HF's default

# --- safetensors, written by hand so that a tensor never has to be in memory
# whole: the header needs only names, dtypes and shapes, which the GGUF gives
# before any data is read. Format: u64 little-endian header length, JSON
# header (padded with spaces to 8 bytes), then the tensors back to back.


def _safetensors_header(tensors: Sequence[PlannedTensor]) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.hf_name] = {"dtype": "BF16", "shape": list(t.shape),
                             "data_offsets": [offset, offset + t.bf16_bytes]}
        offset += t.bf16_bytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def _write_shard(path: str, tensors: Sequence[PlannedTensor], gguf_file, progress) -> None:
    import torch

    with open(path, "wb") as out:
        out.write(_safetensors_header(tensors))
        for t in tensors:
            for block in dequantized_rows(gguf_file, t):
                # numpy has no bfloat16: write the raw 16-bit patterns.
                out.write(block.view(torch.int16).numpy())
            progress(t)


def _shards(tensors: Sequence[PlannedTensor], shard_bytes: int) -> list[list[PlannedTensor]]:
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.bf16_bytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.bf16_bytes
    return shards


def write_safetensors(gguf_path: str, tensors: Sequence[PlannedTensor], out_dir: str, *,
                      shard_bytes: int = SHARD_BYTES, log: Log = print) -> list[str]:
    """Dequantize `tensors` into bf16 safetensors shards (plus the index when
    there is more than one); return the files written."""
    shards = _shards(tensors, shard_bytes)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)])
    total = sum(t.bf16_bytes for t in tensors)
    done = {"tensors": 0, "bytes": 0}
    start = time.time()

    def progress(t: PlannedTensor) -> None:
        done["tensors"] += 1
        done["bytes"] += t.bf16_bytes
        # One line per layer's worth of tensors (or per big tensor).
        if done["tensors"] % 12 == 0 or t.bf16_bytes > 100e6 or done["tensors"] == len(tensors):
            log(f"dequantized {done['tensors']}/{len(tensors)} tensors "
                f"({done['bytes'] / _GB:.2f}/{total / _GB:.2f} GB) in {time.time() - start:.0f} s")

    with open(gguf_path, "rb") as gguf_file:
        for name, shard in zip(names, shards):
            _write_shard(os.path.join(out_dir, name), shard, gguf_file, progress)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {t.hf_name: name for name, shard in zip(names, shards)
                                for t in shard}}
        write_json(os.path.join(out_dir, "model.safetensors.index.json"), index)
        names.append("model.safetensors.index.json")
    return names


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def read_safetensors_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor in a checkpoint directory (headers only)."""
    shapes = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            with open(os.path.join(model_dir, name), "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            shapes.update({k: tuple(v["shape"]) for k, v in header.items()})
    return shapes
