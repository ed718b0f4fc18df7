"""Where the start-up time of `draft_weights` goes: `draft_weights.attach` over a
checkpoint's decoder linear weights, fused as vLLM fuses them (qkv, gate_up),
timed stage by stage. No engine: the weights come from the checkpoint's
safetensors files.

    .venv/bin/python benchmarks/kernels/draft_weights_startup.py [MODEL_DIR] [--scheme int4] [--layers N]

Stages (int4): the float32 copy and min/max, the sampled grid check, the full
grid search (only for weights whose sample shows a grid), rounding, torch's
int4 packing, and the sha256 of the weight's bytes (what the on-disk cache of
core/draft_weights_cache.py keys by). Then `attach` itself: as an engine calls it,
cold cache and warm cache (in a temporary cache folder, so nothing of the user's
is touched), and without the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

DEFAULT_MODEL = "~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct"
_FUSED = {  # vLLM's fused linear -> the checkpoint's tensors, stacked along rows
    "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_proj": ("self_attn.o_proj",),
    "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "down_proj": ("mlp.down_proj",),
}


def load_linears(model_dir: Path, num_layers: int | None, dtype=torch.bfloat16):
    """[(name, weight)] of the decoder's linear layers, fused as vLLM loads them."""
    from safetensors import safe_open

    where = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            where.update((name, path) for name in f.keys())
    config = json.loads((model_dir / "config.json").read_text())
    layers = config["num_hidden_layers"] if num_layers is None else num_layers
    out = []
    for i in range(layers):
        for fused, parts in _FUSED.items():
            tensors = []
            for part in parts:
                name = f"model.layers.{i}.{part}.weight"
                with safe_open(str(where[name]), framework="pt") as f:
                    tensors.append(f.get_tensor(name).to(dtype))
            out.append((f"layers.{i}.{fused}", torch.cat(tensors).contiguous()))
    return out


def as_layer(weight: torch.Tensor) -> nn.Module:
    layer = nn.Module()
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.bias = None
    return layer


def stages_int4(weight: torch.Tensor, times: dict) -> None:
    """The int4 quantizer's stages, each timed (as core/draft_weights.py runs them)."""
    from vllm_layerskip.core import draft_weights as dw

    group = dw._GROUP
    t = time.perf_counter()
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group, group)
    low = groups.amin(dim=-1, keepdim=True)
    span = groups.amax(dim=-1, keepdim=True) - low
    step = (span / 15).clamp(min=1e-10)
    times["float32 copy, min/max"] += time.perf_counter() - t
    t = time.perf_counter()
    flat = groups.reshape(-1, group)
    shows_grid = dw._shows_grid(flat, low.reshape(-1, 1), span.reshape(-1, 1))
    times["grid: sampled check"] += time.perf_counter() - t
    if shows_grid:
        t = time.perf_counter()
        grid, found = dw._grid_steps(flat, low.reshape(-1, 1), span.reshape(-1, 1))
        step = torch.where(found, grid, step.reshape(-1, 1)).reshape(step.shape)
        times["grid: full search"] += time.perf_counter() - t
        times["(weights with a grid)"] += 1
    t = time.perf_counter()
    q = torch.round((groups - low) / step).clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = low + 8 * step
    scales = torch.cat([step, zero], dim=-1).transpose(0, 1).contiguous().to(weight.dtype)
    times["round, scales"] += time.perf_counter() - t
    t = time.perf_counter()
    torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    times["torch int4 packing"] += time.perf_counter() - t
    del scales


def sha256_of(weight: torch.Tensor) -> str:
    return hashlib.sha256(weight.contiguous().view(torch.uint8).numpy()).hexdigest()


def warm_stages(linears, scheme: str) -> None:
    """A warm start's parts: the key (sha256 of the weight), reading and checking
    the file, packing for torch's kernel."""
    from vllm_layerskip.core import draft_weights as dw
    from vllm_layerskip.core import draft_weights_cache as cache

    times: dict = defaultdict(float)
    kind = "int4" if scheme == "int4" else "int8"
    for _, weight in linears:
        int4 = kind == "int4" and weight.shape[1] % dw._GROUP == 0 and weight.shape[0] % 16 == 0
        grid = dw.DEFAULT_GRID if int4 else None
        t = time.perf_counter()
        fields = cache.key_fields(weight, "int4" if int4 else "int8", grid, dw._GROUP)
        key = cache.weight_key(weight, fields)
        times["key: sha256 of the weight"] += time.perf_counter() - t
        path = cache.folder() / f"{fields['kind']}-{key[:40]}.safetensors"
        t = time.perf_counter()
        stored = cache.load(path, key)
        times["read the file, check its sha256"] += time.perf_counter() - t
        t = time.perf_counter()
        if int4:
            dw._pack_int4(stored["q"])
        elif scheme == "w8a8":
            dw._prepack_w8a8(stored["q"], stored["scale"])
        times["pack for the kernel"] += time.perf_counter() - t
    for stage, seconds in times.items():
        print(f"  warm: {stage:32s} {seconds:7.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--scheme", default="int4")
    parser.add_argument("--layers", type=int, default=None, help="first N decoder layers only")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: "
                        "stages, nocache, warm-stages")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from vllm_layerskip.core import draft_weights

    model_dir = Path(os.path.expanduser(args.model))
    t = time.perf_counter()
    linears = load_linears(model_dir, args.layers)
    load_s = time.perf_counter() - t
    numel = sum(w.numel() for _, w in linears)
    print(f"{model_dir.name}: {len(linears)} linear weights, {numel / 1e9:.2f} G weights, "
          f"read and fused in {load_s:.1f} s; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")

    skip = set(filter(None, args.skip.split(",")))
    times: dict = defaultdict(float)
    if args.scheme == "int4" and "stages" not in skip:
        for _, weight in linears:
            stages_int4(weight, times)
    t = time.perf_counter()
    for _, weight in linears:
        sha256_of(weight)
    times["sha256 of the weight bytes"] = time.perf_counter() - t
    for stage, seconds in times.items():
        unit = "" if stage.startswith("(") else " s"
        print(f"  {stage:32s} {seconds:7.2f}{unit}")

    def attach_all(label: str) -> float:
        t = time.perf_counter()
        for _, weight in linears:
            draft_weights.attach(as_layer(weight), args.scheme)
        seconds = time.perf_counter() - t
        print(f"  attach, {label:26s} {seconds:7.2f} s")
        return seconds

    try:
        from vllm_layerskip.core import draft_weights_cache as cache
    except ImportError:  # before the cache existed
        attach_all("(this plugin has no cache)")
        return
    with tempfile.TemporaryDirectory() as folder:
        previous = {k: os.environ.get(k) for k in (cache.CACHE_ENV, cache.DISABLE_ENV)}
        os.environ[cache.CACHE_ENV] = folder
        try:
            if "nocache" not in skip:
                os.environ[cache.DISABLE_ENV] = "0"
                attach_all("no cache")
            os.environ.pop(cache.DISABLE_ENV, None)
            attach_all("cache cold (builds, writes)")
            attach_all("cache warm (reads)")
            size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
            print(f"  cache: {size / 1e9:.2f} GB in {folder}")
            if "warm-stages" not in skip:
                warm_stages(linears, args.scheme)
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


if __name__ == "__main__":
    main()
