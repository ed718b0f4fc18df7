"""The quantized draft copies (core/draft_weights.py), kept on disk between starts.

Making Qwen2.5-Coder-1.5B's int4 copy takes minutes on 2 cores, nearly all of
it the search for the checkpoint's 4-bit grid (a sort of every group of 32):
190 s of `attach` over its 112 linear weights on a 2-core AVX2 EPYC, where
reading them back from this cache takes seconds
(benchmarks/kernels/draft_weights_startup.py). The engine started 95 s later than
plain with the copies made at every start.

One file per weight, under `$VLLM_LAYERSKIP_CACHE/draft_weights/` (default
`~/.cache/vllm_layerskip/draft_weights/`), named by its key:

- **Key**: sha256 over the weight's own bytes and everything that shapes the
  copy (what is stored: int4 with its grid, or int8; the group size; dtype and
  shape; torch's version; this file format's VERSION). The whole tensor is
  hashed, not a sample of it: a fine-tune or merge that changed only some rows
  must not read the old copy. It costs ~1 s per GB of weights (the 1.5B
  model's linears: 2.6 GB, 2.2 s), against minutes to quantize. (A stale copy
  could not change what the engine outputs, verification reads the model's own
  weights, only how often drafts are accepted; still, never serve one.)
- **Content**: the quantized values before any kernel's packing (int4: two 4-bit
  values a byte in this module's own order, and the (scale, zero) pairs; int8
  and w8a8 share one entry: int8 values and a scale a row). torch's packed
  int4 layout can depend on the CPU, and FBGEMM's packed w8a8 weight cannot be
  saved; both are packed at load, so a cache copied from another machine is
  never misread.
- **Checked on load**: the file's format, version and key, the tensors' names,
  dtypes and shapes, and a sha256 of their bytes recorded at write. A corrupt,
  truncated or foreign file is never used: a warning names it and the copy is
  made again and written over it.
- **Written atomically**: a temporary file in the same folder, renamed over
  the final name, so no reader (another engine starting, a restart) sees a
  partial file; a crash before the rename leaves only a hidden temporary file.
  No fsync: a file the rename made but the disk lost is caught by the checksum.
- **Off** with `VLLM_LAYERSKIP_DRAFT_WEIGHTS_CACHE=0`: the copies are made at
  every start and nothing is read or written. Weights smaller than MIN_ELEMENTS
  are not cached (they quantize in milliseconds). Nothing deletes old entries:
  remove the folder to reclaim the space (0.82 GB for the 1.5B model's int4
  copy).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger("vllm.layerskip")

CACHE_ENV = "VLLM_LAYERSKIP_CACHE"  # the project's cache folder (tools/prepare_model.py)
DISABLE_ENV = "VLLM_LAYERSKIP_DRAFT_WEIGHTS_CACHE"  # "0": no cache
SUBDIR = "draft_weights"
FORMAT = "vllm-layerskip/draft-weights-cache"
# Bump when the stored content changes: the layout here, or what a quantizer in
# core/draft_weights.py computes. Part of every key, so old files are not read.
VERSION = 1
MIN_ELEMENTS = 1 << 20  # smaller weights quantize in milliseconds: not worth a file
_OFF = ("0", "off", "false", "no")
_SUFFIX = ".safetensors"

_write_failed = False  # one warning per process when the folder is not writable


def folder() -> Path | None:
    """Where the copies are kept; None when the cache is turned off."""
    if os.environ.get(DISABLE_ENV, "").strip().lower() in _OFF:
        return None
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                     "vllm_layerskip")
    return Path(root) / SUBDIR


def key_fields(weight: torch.Tensor, kind: str, grid: str | None, group: int) -> dict:
    """Everything beside the weight's bytes that shapes the stored copy."""
    return {"format": FORMAT, "version": VERSION, "kind": kind, "grid": grid,
            "group": group, "dtype": str(weight.dtype).removeprefix("torch."),
            "shape": list(weight.shape), "torch": torch.__version__}


def weight_key(weight: torch.Tensor, fields: dict) -> str:
    """sha256 of the fields and of every byte of the weight (64 hex digits)."""
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    digest.update(_bytes_of(weight))
    return digest.hexdigest()


def tensors_checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(_bytes_of(tensors[name]))
    return digest.hexdigest()


def _bytes_of(tensor: torch.Tensor):
    """The tensor's bytes as a buffer, without copying a contiguous CPU tensor."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def cached(weight: torch.Tensor, kind: str, grid: str | None, group: int,
           build: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The stored copy of `weight` for this kind and grid, or `build()`'s, which
    is then stored for the next start. `build` returns named CPU tensors."""
    where = folder()
    if where is None or weight.numel() < MIN_ELEMENTS:
        return build()
    fields = key_fields(weight, kind, grid, group)
    key = weight_key(weight, fields)
    path = where / f"{kind}-{key[:40]}{_SUFFIX}"
    if path.exists():
        stored = load(path, key)
        if stored is not None:
            return stored
    tensors = build()
    store(path, key, fields, tensors)
    return tensors


def load(path: Path, key: str) -> dict[str, torch.Tensor] | None:
    """The file's tensors if it is this key's intact copy; None (and a warning
    naming the file) if it is corrupt, truncated or another key's."""
    problem = None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                problem = f"is not a draft-weights cache file (no \"format\": \"{FORMAT}\")"
            elif meta.get("version") != str(VERSION):
                problem = f"has version {meta.get('version')!r}, this plugin reads {VERSION}"
            elif meta.get("key") != key:
                problem = "holds the copy of another weight (its key differs from its name's)"
            else:
                tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for a damaged file
        problem = f"is not a readable safetensors file ({type(e).__name__}: {e})"
    if problem is None:
        expected = json.loads(meta.get("tensors", "{}"))
        found = {name: [str(t.dtype).removeprefix("torch."), list(t.shape)]
                 for name, t in tensors.items()}
        if not expected or found != expected:
            problem = f"holds tensors {found}, its header says {expected}"
        elif tensors_checksum(tensors) != meta.get("checksum"):
            problem = "fails its checksum (its tensors' bytes changed since it was written)"
    if problem is not None:
        logger.warning("vllm-layerskip: draft-weights cache file '%s' %s; making the copy "
                       "again and rewriting the file.", path, problem)
        return None
    return tensors


def store(path: Path, key: str, fields: dict, tensors: dict[str, torch.Tensor]) -> bool:
    """Write the copy to `path` atomically (a temporary file renamed over it).
    False, with one warning per process, where it cannot be written."""
    global _write_failed
    from safetensors.torch import save_file

    tensors = {name: t.contiguous() for name, t in tensors.items()}
    meta = {"format": FORMAT, "version": str(VERSION), "key": key,
            "fields": json.dumps(fields, sort_keys=True),
            "tensors": json.dumps({name: [str(t.dtype).removeprefix("torch."), list(t.shape)]
                                   for name, t in tensors.items()}),
            "checksum": tensors_checksum(tensors)}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        save_file(tensors, tmp, metadata=meta)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users of a shared folder
        os.replace(tmp, path)
        return True
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written only costs time
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if not _write_failed:
            _write_failed = True
            logger.warning("vllm-layerskip: cannot write the draft-weights cache in '%s' (%s: "
                           "%s); the quantized copies are made again at every start. Set %s "
                           "to another folder, or %s=0 to turn the cache off.", path.parent,
                           type(e).__name__, e, CACHE_ENV, DISABLE_ENV)
        return False
