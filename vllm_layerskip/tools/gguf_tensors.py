"""Which tensors of a GGUF file become which tensors of a Hugging Face
checkpoint (qwen2 layout), and reading their data: dequantized to bf16 a few MB
at a time, straight from the file (gguf_convert.py converts the whole model)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

from vllm_layerskip.tools.gguf_parts import ModelPreparationError

# GGUF tensor names (llama.cpp's) -> HF names for qwen2. Qwen2's Q/K weights
# are stored in HF's row order: llama.cpp's converter permutes Q/K rows only
# for llama-architecture models, so nothing is un-permuted here. Checked on
# the real Qwen2.5-Coder GGUF: all 339 tensors equal transformers' GGUF loader
# bit for bit (in bf16), and vLLM generates sensible code from the result.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM"}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)$")

_CHUNK_BYTES = 32 << 20  # fp32 bytes dequantized at a time


def hf_tensor_name(gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor (qwen2 layout), or None if unknown."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def _hf_order(hf_name: str) -> tuple:
    # Embeddings, then layers in numeric order, then the final norm and head:
    # the order HF checkpoints use, so each shard holds whole layers.
    m = re.match(r"model\.layers\.(\d+)\.", hf_name)
    if m:
        return (1, int(m.group(1)), hf_name)
    return (0 if "embed" in hf_name else 2, 0, hf_name)


@dataclass(frozen=True)
class PlannedTensor:
    hf_name: str
    gguf_name: str
    qtype: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # HF (row-major) order: GGUF's dims reversed
    data_offset: int
    n_bytes: int

    @property
    def bf16_bytes(self) -> int:
        return 2 * math.prod(self.shape)


def gguf_field(reader, key: str, default=None):
    f = reader.get_field(key)
    return default if f is None else f.contents()


def plan_tensors(reader, gguf_path: str) -> list[PlannedTensor]:
    planned, unknown = [], []
    for t in reader.tensors:
        hf_name = hf_tensor_name(t.name)
        if hf_name is None:
            unknown.append(t.name)
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        planned.append(PlannedTensor(hf_name, t.name, t.tensor_type, shape,
                                     int(t.data_offset), int(t.n_bytes)))
    if unknown:
        raise ModelPreparationError(
            f"{gguf_path} has tensors this converter cannot place: {unknown[:5]}"
            f"{' ...' if len(unknown) > 5 else ''}; it is not a plain qwen2 model. Use the GGUF "
            f"of a supported model."
        )
    return sorted(planned, key=lambda p: _hf_order(p.hf_name))


_EMBED, _HEAD = "token_embd.weight", "output.weight"
# How far (relative RMS) two quantizations of one matrix may differ: Q5_0 against
# Q8_0 of Qwen2.5-Coder-0.5B's embedding differ by 0.04, two different matrices
# of that shape by ~1.4.
_SAME_MATRIX_RTOL = 0.25
_SAME_MATRIX_ROWS = 1024


def tie_embeddings(planned: Sequence[PlannedTensor], keep: str, gguf_path: str) -> list[PlannedTensor]:
    """A tied model whose GGUF carries the shared matrix twice, as token_embd
    and as output quantized differently (llama.cpp's quantizer can give the
    head a finer type): keep one copy, `keep` (a GGUF name), as the tied
    model.embed_tokens.weight, after checking on its first rows that the two
    are the same matrix; an untied head is an error, never dropped."""
    import numpy as np

    by_name = {t.gguf_name: t for t in planned}
    if keep not in (_EMBED, _HEAD):
        raise ValueError(f"tied_embeddings_from must be {_EMBED!r} or {_HEAD!r}, not {keep!r}")
    if _EMBED not in by_name:
        raise ModelPreparationError(f"{gguf_path} has no {_EMBED}; it is not a plain qwen2 model")
    if _HEAD not in by_name:
        return list(planned)  # already stored once: tied as it is
    embed, head = by_name[_EMBED], by_name[_HEAD]
    if embed.shape != head.shape:
        raise ModelPreparationError(
            f"{gguf_path}: {_HEAD} has shape {list(head.shape)} and {_EMBED} "
            f"{list(embed.shape)}; they cannot be one tied matrix. The GGUF differs from the "
            f"model this converter was told to expect: check the package name and version pin.")
    with open(gguf_path, "rb") as f:
        a, b = (_first_rows(f, t, _SAME_MATRIX_ROWS) for t in (embed, head))
    diff = float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)), 1e-30))
    if not diff <= _SAME_MATRIX_RTOL:
        raise ModelPreparationError(
            f"{gguf_path}: {_HEAD} and {_EMBED} differ (relative RMS {diff:.2f} over the first "
            f"{len(a)} rows, at most {_SAME_MATRIX_RTOL} for two quantizations of one matrix): "
            f"the head is not tied to the embedding, so dropping one would change the model. "
            f"The GGUF differs from the model this converter was told to expect: check the "
            f"package name and version pin.")
    kept = by_name[keep]
    tied = PlannedTensor(_GLOBAL_NAMES[_EMBED], kept.gguf_name, kept.qtype, kept.shape,
                         kept.data_offset, kept.n_bytes)
    return sorted([t for t in planned if t.gguf_name not in (_EMBED, _HEAD)] + [tied],
                  key=lambda p: _hf_order(p.hf_name))


def _first_rows(gguf_file, t: PlannedTensor, rows: int):
    import numpy as np

    for block in dequantized_rows(gguf_file, t, max_rows=rows):
        return block.float().numpy().astype(np.float64)


def dequantized_rows(gguf_file, t: PlannedTensor, max_rows: int | None = None) -> Iterator:
    """Yield the tensor as consecutive bf16 row blocks (torch tensors); with
    `max_rows`, one block of at most that many rows first."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    cols = t.shape[-1]
    rows = math.prod(t.shape[:-1])
    row_bytes = t.n_bytes // rows
    step = max(1, _CHUNK_BYTES // (4 * cols))
    if max_rows is not None:
        step = min(step, max_rows)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        buf = np.empty((n, row_bytes), dtype=np.uint8)
        gguf_file.seek(t.data_offset + r0 * row_bytes)
        if gguf_file.readinto(memoryview(buf).cast("B")) != buf.nbytes:
            raise ModelPreparationError(
                f"{gguf_file.name} ends inside tensor {t.gguf_name}: the GGUF is truncated; "
                f"delete it and retry"
            )
        values = np.ascontiguousarray(dequantize(buf, t.qtype), dtype=np.float32)
        # torch's float32 -> bfloat16 rounds to nearest even, as transformers does.
        yield torch.from_numpy(values.reshape(n, cols)).to(torch.bfloat16)
