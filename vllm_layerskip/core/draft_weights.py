"""Draft weights: the decoder's linear layers, quantized once at load, for draft
passes only.

A decode step on a memory-bound CPU costs the bytes of weights it reads. A
layer-skip draft reads fewer layers; a draft that reads each kept layer's
weights at 4 bits instead of 16 reads a quarter of the bytes. Verification
still runs the model's own weights, so the output stays the target's: only
acceptance can change, and a draft token that disagrees is rejected as any
other.

Measured on the 2-core AVX512-BF16 CPU (one Qwen2.5-Coder-1.5B layer, one
token, torch 2.13): vLLM's oneDNN bf16 linears 3.27 ms a layer, torch's int8
weight-only kernel 2.43 ms, its int4 kernel (groups of 32) 1.54 ms.

Schemes (`draft_weights`):
- "int4": asymmetric 4-bit, one scale and zero per 32 weights of a row, read
  by the project's AVX512-VNNI kernel or torch's `_weight_int4pack_mm_for_cpu`
  (core/int4_kernels.py says which where); a weight whose rows are not a
  multiple of 32 long, or whose row count is not a multiple of 16 (torch's
  tiles), falls back to int8 weight-only (`_weight_int8pack_mm`).
- "int8" (that weight-only kernel for every weight) is deprecated: slower than
  "int4" at 1-4 tokens a pass and than "w8a8" at more (below), it never paid.
  Accepted, with a warning, for one release.
- "w8a8": int8 weights (symmetric, one scale per output row), and each pass's activations quantized to
  8 bits per token on the fly (core/w8a8_kernels.py: vLLM's VNNI int8 GEMM
  for bf16 on AVX512-VNNI CPUs, FBGEMM's dynamic int8 linear elsewhere):
  reads int8 weights once for all of a pass's tokens, so it gains at any pass
  size (8 concurrent requests), where the weight-only kernels compute token
  by token. Its drafts are less exact: activation rounding costs ~1-8% of a
  linear's output norm against ~0.5% for "int4" on a 4-bit checkpoint's grid.

Grids (`draft_weights_grid`, "int4" only): "auto" keeps the 4-bit grid of a
checkpoint dequantized from 4 bits where a sample of a weight's groups shows
one (`_int4_steps`), "minmax" always takes each group's (max - min) / 15.

The copies are made once per weight and kept on disk
(core/draft_weights_cache.py): a later start with the same weights reads them
(the 1.5B model's int4 copy took minutes to make on 2 cores).

CPU only: the GPU kernels want other layouts and have not run here. The copy
costs memory beside the model's weights: 5 bits a weight for int4, 8 for int8
and w8a8 (0.82 / 1.31 GB on Qwen2.5-Coder-1.5B, as its engines logged them).
"""

from __future__ import annotations

import torch
from torch import nn

from vllm_layerskip.core import draft_weights_cache, int4_kernels, w8a8_kernels
from vllm_layerskip.core.draft_layer import DraftLayer
from vllm_layerskip.core.errors import LayerSkipConfigError

SCHEMES = ("int4", "w8a8")  # what `draft_weights` takes
DEPRECATED_SCHEMES = ("int8",)  # accepted with a warning for one release
# How "int4" picks each group's step (`draft_weights_grid`): "auto" finds a
# checkpoint's own 4-bit grid where it has one, "minmax" never looks for one.
GRIDS = ("auto", "minmax")
DEFAULT_GRID = "auto"
ATTR = "layerskip_draft_linear"  # set on each vLLM linear layer that has a copy
_GROUP = 32
_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# torch's weight-only CPU kernels read fewer bytes but compute row by row: on a
# 17920 x 1536 linear (the 1.5B's gate_up, 2-core AVX512-BF16 CPU) at 1 / 2 / 4
# / 8 tokens, int4 took 0.95 / 1.20 / 1.69 / 3.28 ms and int8 2.01 / 2.35 /
# 2.49 / 4.60 ms against vLLM's oneDNN bf16 3.20 / 2.82 / 2.46 / 2.75 ms.
# w8a8 reads its weights once for a whole pass: the 1.5B's 112 linears (28
# layers), weights cycled beyond the caches, took 46 / 40 / 49 / 75 / 125 ms at
# 1 / 4 / 8 / 16 / 32 tokens with vLLM's VNNI kernel (49 / 50 / 53 / 81 / 150
# with FBGEMM's), int4 41 / 66 / 133 / 272 / 514 ms, torch's bf16 linear
# 150 / 128 / 163 / 197 / 290 ms (w8a8_kernels.py).
# (benchmarks/kernels/bench_draft_linears.py; docs/draft-weights.md has a rerun through
# these copies' own calls, on a slower hour: same ordering.)
# Draft passes of more tokens than this run the model's own weights (None: any size).
MAX_TOKENS = {"int4": 4, "int8": 2, "w8a8": None}


class QuantizedLinear:
    """A vLLM linear layer's weight, quantized; called as the layer is:
    (output, None), or output alone when the layer does not return a bias."""

    def __init__(self, layer: nn.Module, scheme: str, grid: str = DEFAULT_GRID):
        weight = layer.weight.detach()
        if weight.device.type != "cpu":
            raise LayerSkipConfigError(
                f"'draft_weights': \"{scheme}\" runs on CPU only (torch's quantized "
                f"kernels for CPU); this model is on {weight.device.type}. Remove the key."
            )
        self.dtype = weight.dtype
        self.out_features, self.in_features = weight.shape
        if grid not in GRIDS:
            raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
        if scheme == "int4" and weight.shape[1] % _GROUP == 0 and weight.shape[0] % 16 == 0:
            self.scheme = "int4"
        else:
            self.scheme = "w8a8" if scheme == "w8a8" else "int8"
            grid = None  # one symmetric scale a row: no grid to choose
        self.grid = grid
        self.kernel = None  # int4_kernels.KERNELS or w8a8_kernels.KERNELS
        if self.scheme == "int4":
            self.kernel = int4_kernels.choose(self.dtype, self.out_features, self.in_features)
        elif self.scheme == "w8a8":
            self.kernel = w8a8_kernels.choose(self.dtype, self.out_features, self.in_features)
        # What is stored is the same for int8 and w8a8 (int8 q, a scale a row),
        # and never a CPU-specific packed layout: packing is done here, at every start.
        kind = "int4" if self.scheme == "int4" else "int8"
        stored = draft_weights_cache.cached(
            weight, kind, grid, _GROUP,
            lambda: _quantize_int4(weight, grid) if kind == "int4" else _quantize_int8(weight))
        if self.kernel == "vnni" and self.scheme == "int4":
            self.packed, self.scales = int4_kernels.tile(stored["q"], stored["scales"])
        elif self.scheme == "int4":
            self.packed = _pack_int4(stored["q"])
            self.scales = stored["scales"]
        elif self.scheme == "w8a8":
            self.packed, self.scales = w8a8_kernels.prepack(self.kernel, stored["q"], stored["scale"])
        else:
            self.packed, self.scales = stored["q"], stored["scale"]
        # vLLM's bias rules: a row-parallel layer adds its bias on rank 0 only
        # (after the all-reduce would add it tp times), none with skip_bias_add.
        bias = getattr(layer, "bias", None)
        self.row_parallel = hasattr(layer, "input_is_parallel")
        tp_rank = getattr(layer, "tp_rank", 0)
        if getattr(layer, "skip_bias_add", False) or (self.row_parallel and tp_rank > 0):
            bias = None
        self.bias = None if bias is None else bias.detach().clone()
        self.all_reduce = self.row_parallel and getattr(layer, "reduce_results", True) \
            and getattr(layer, "tp_size", 1) > 1
        self.return_bias = getattr(layer, "return_bias", True)

    @property
    def nbytes(self) -> int:
        if self.scheme == "w8a8":  # a packed int8 weight, a scale, zero and offset a row
            return self.out_features * (self.in_features + 16)
        return self.packed.nbytes + self.scales.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(self.dtype)
        if self.kernel == "vnni" and self.scheme == "int4":  # adds the bias itself
            out = int4_kernels.matmul(x2, self.packed, self.scales, self.out_features, self.bias)
            return out.reshape(*shape[:-1], self.out_features)
        if self.scheme == "int4":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, _GROUP, self.scales)
        elif self.scheme == "w8a8":
            out = w8a8_kernels.matmul(self.kernel, x2, self.packed, self.scales, self.dtype)
        else:
            out = torch.ops.aten._weight_int8pack_mm(x2, self.packed, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def __call__(self, x: torch.Tensor):
        out = self.matmul(x)
        if self.all_reduce:
            from vllm.distributed import tensor_model_parallel_all_reduce

            out = tensor_model_parallel_all_reduce(out)
        return (out, None) if self.return_bias else out


# What the quantizers below compute is what the on-disk cache stores: a change
# to their output must bump draft_weights_cache.VERSION, or old copies are read.


def _quantize_int4(weight: torch.Tensor, grid: str = DEFAULT_GRID) -> dict[str, torch.Tensor]:
    """Asymmetric 4-bit per group of 32 along the input dimension: w ~ (q - 8) *
    scale + zero with q in 0..15. Returns {"q": [n, k / 2] uint8, two 4-bit values
    a byte (column 2j in the low half, 2j + 1 in the high), "scales": [k / 32, n, 2]
    (scale, zero) of each group per output row, the layout torch's CPU int4 kernel
    reads}; `_pack_int4` turns q into the kernel's packed weight."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // _GROUP, _GROUP)
    low = groups.amin(dim=-1, keepdim=True)
    if grid == "minmax":
        scale = ((groups.amax(dim=-1, keepdim=True) - low) / 15).clamp(min=1e-10)
    else:
        scale = _int4_steps(groups, low)
    q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.uint8).reshape(n, k)
    zero = low + 8 * scale
    scales = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous().to(weight.dtype)
    return {"q": (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), "scales": scales}


def _pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[n, k / 2] two 4-bit values a byte (`_quantize_int4`) -> torch's packed CPU
    int4 weight, whose layout may depend on the CPU torch runs on."""
    n, half = q.shape
    unpacked = torch.empty(n, 2 * half, dtype=torch.int32)
    unpacked[:, 0::2] = q & 15
    unpacked[:, 1::2] = q >> 4
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpacked, 1)


def _int4_steps(groups: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """[..., 1] each group's step: (max - min) / 15, unless its weights already
    lie on a grid of at most 16 levels (a checkpoint dequantized from 4 bits,
    e.g. GGUF Q4_K: Qwen2.5-Coder-1.5B's groups of 32 hold 7-15 distinct
    values), whose step then keeps them exactly. On that model the grid step
    took the int4 copy's error from 4.4% of the weights' norm to ~0.45% (bf16
    rounding) in the layers quantized to 4 bits, and full-depth drafts from 93%
    to 97.6% accepted (K = 4, four prompts)."""
    span = groups.amax(dim=-1, keepdim=True) - low
    step = (span / 15).clamp(min=1e-10)
    flat = groups.reshape(-1, groups.shape[-1])
    if not _shows_grid(flat, low.reshape(-1, 1), span.reshape(-1, 1)):
        return step
    grid, found = _grid_steps(flat, low.reshape(-1, 1), span.reshape(-1, 1))
    return torch.where(found, grid, step.reshape(-1, 1)).reshape(step.shape)


def _shows_grid(flat: torch.Tensor, low: torch.Tensor, span: torch.Tensor) -> bool:
    """Whether most of a sample of a weight's [G, 32] groups (512, evenly
    spread) lie on a grid: only then does `_int4_steps` search every group
    (a sort of each, ~1 s per 10M weights on 2 cores)."""
    count = min(512, flat.shape[0])
    sample = torch.arange(count) * (flat.shape[0] - 1) // max(count - 1, 1)
    _, found = _grid_steps(flat[sample], low[sample], span[sample])
    return bool(found.float().mean() >= 0.5)


def _grid_steps(groups: torch.Tensor, low: torch.Tensor, span: torch.Tensor):
    """[G, 32] groups -> ([G, 1] grid step, [G, 1] whether the group is on it)."""
    gaps = torch.sort(groups, dim=-1).values.diff(dim=-1)
    gaps = torch.where(gaps > 1e-3 * span, gaps, torch.inf)
    smallest = gaps.amin(dim=-1, keepdim=True)  # about one or a few grid steps
    step = torch.ones_like(span)
    found = torch.zeros_like(span, dtype=torch.bool)
    for parts in (1, 2, 3):
        # The step from the whole span (bf16 rounding moves single gaps by ~3%).
        levels = torch.round(span / smallest * parts).clamp(min=1)
        candidate = span / levels
        q = (groups - low) / candidate
        on_grid = ((q - q.round()).abs().amax(dim=-1, keepdim=True) < 0.2) \
            & (levels <= 15) & torch.isfinite(candidate) & ~found
        step = torch.where(on_grid, candidate, step)
        found |= on_grid
    return step, found


def _quantize_int8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Symmetric 8-bit, one scale per output row: {"q": [n, k] int8, "scale": [n]}."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-10)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return {"q": q, "scale": scale.to(weight.dtype)}


def attach(layer: nn.Module, scheme: str, grid: str = DEFAULT_GRID) -> None:
    """Give a vLLM linear layer its draft copy (called before vLLM prepares the
    layer's own weight for its kernels, which on CPU drops the plain weight);
    `grid`: how "int4" picks its steps (GRIDS)."""
    weight = getattr(layer, "weight", None)
    if weight is None or weight.ndim != 2 or weight.is_meta or weight.numel() == 0:
        return
    setattr(layer, ATTR, QuantizedLinear(layer, scheme, grid))


def draft_layers(layers: list[nn.Module]) -> list[DraftLayer] | None:
    """Each layer's quantized view, or None when no layer has draft copies;
    an error when only some have (a linear method other than vLLM's plain one)."""
    linears = [(layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                layer.mlp.down_proj) for layer in layers]  # in _LINEARS' order
    have = [all(hasattr(m, ATTR) for m in group) for group in linears]
    if not any(have):
        return None
    if not all(have):
        missing = [i for i, h in enumerate(have) if not h]
        raise LayerSkipConfigError(
            f"'draft_weights' could not quantize the linear layers of decoder layers "
            f"{missing}: they are not plain (unquantized) weights. Use a bf16/fp16/fp32 "
            "checkpoint, or remove 'draft_weights'."
        )
    views = []
    for layer, group in zip(layers, linears):
        copies = dict(zip(_LINEARS, (getattr(m, ATTR) for m in group)))
        views.append(DraftLayer(layer, copies, MAX_TOKENS[copies["gate_up_proj"].scheme]))
    return views


def total_bytes(layers: list[DraftLayer]) -> int:
    return sum(m.nbytes for d in layers for m in d.linears.values())
