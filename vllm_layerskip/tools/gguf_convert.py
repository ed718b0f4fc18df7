"""Convert a GGUF file into a Hugging Face checkpoint that vLLM and transformers
load directly: bfloat16 safetensors shards, config.json, generation_config.json
and the tokenizer with its chat template.

The conversion streams: each tensor is read from the GGUF file and dequantized
a few MB at a time and written straight into its place in a safetensors shard,
so memory stays far below the model size (transformers' own GGUF loading builds
an fp32 copy of the whole model first, 7 GB for a 1.5B model; peak RSS here:
1.1 GB, in the tokenizer's construction).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

from vllm_layerskip.tools.gguf_parts import (
    _GB,
    Log,
    ModelPreparationError,
    _check_free_space,
    _disk_full_is_clear,
)


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
_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM"}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)$")

_SHARD_BYTES = 1 << 30  # ~1 GB shards, like HF's default
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
class _PlannedTensor:
    hf_name: str
    gguf_name: str
    qtype: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # HF (row-major) order: GGUF's dims reversed
    data_offset: int
    n_bytes: int

    @property
    def bf16_bytes(self) -> int:
        return 2 * math.prod(self.shape)


def _field(reader, key: str, default=None):
    f = reader.get_field(key)
    return default if f is None else f.contents()


def _plan_tensors(reader, gguf_path: str) -> list[_PlannedTensor]:
    planned, unknown = [], []
    for t in reader.tensors:
        hf_name = hf_tensor_name(t.name)
        if hf_name is None:
            unknown.append(t.name)
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        planned.append(_PlannedTensor(hf_name, t.name, t.tensor_type, shape,
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


def _tie_embeddings(planned: Sequence[_PlannedTensor], keep: str, gguf_path: str) -> list[_PlannedTensor]:
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
    tied = _PlannedTensor(_GLOBAL_NAMES[_EMBED], kept.gguf_name, kept.qtype, kept.shape,
                          kept.data_offset, kept.n_bytes)
    return sorted([t for t in planned if t.gguf_name not in (_EMBED, _HEAD)] + [tied],
                  key=lambda p: _hf_order(p.hf_name))


def _first_rows(gguf_file, t: _PlannedTensor, rows: int):
    import numpy as np

    for block in _dequantized_rows(gguf_file, t, max_rows=rows):
        return block.float().numpy().astype(np.float64)


def _as_float(value) -> float:
    # GGUF stores floats as float32: 1e-6 arrives as 9.999999974752427e-07.
    # str() of the float32 is its shortest round-trip repr ("1e-06").
    import numpy as np

    return float(str(np.float32(value)))


def _build_config(reader, tensors: Sequence[_PlannedTensor], torch_dtype: str = "bfloat16") -> dict:
    """config.json contents for the GGUF's model (metadata + tensor shapes)."""
    from transformers import AutoConfig

    arch = _field(reader, "general.architecture")
    shapes = {t.hf_name: t.shape for t in tensors}
    vocab_size, hidden_size = shapes["model.embed_tokens.weight"]

    def meta(key, default=None):
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelPreparationError(
                f"GGUF metadata lacks {arch}.{key}; cannot build config.json")
        return value

    rope_theta = _as_float(meta("rope.freq_base", 10000.0))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    config = AutoConfig.for_model(
        arch,
        architectures=[_ARCHITECTURES[arch]],
        vocab_size=int(vocab_size),
        hidden_size=int(hidden_size),
        intermediate_size=int(meta("feed_forward_length")),
        num_hidden_layers=int(meta("block_count")),
        num_attention_heads=int(meta("attention.head_count")),
        num_key_value_heads=int(meta("attention.head_count_kv")),
        max_position_embeddings=int(meta("context_length")),
        rms_norm_eps=_as_float(meta("attention.layer_norm_rms_epsilon")),
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings="lm_head.weight" not in shapes,
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
        use_sliding_window=False,
    )
    # The diff dict is what save_pretrained writes: the model's own fields,
    # without the generic defaults (id2label, return_dict, ...).
    cfg = config.to_diff_dict()
    # transformers 5 writes only rope_parameters; readers that look for the
    # flat key would silently fall back to 10000.
    cfg["rope_theta"] = rope_theta
    cfg["dtype"] = cfg["torch_dtype"] = torch_dtype
    return cfg


def _expected_shapes(cfg: Mapping) -> dict[str, tuple[int, ...]]:
    """Every tensor a Qwen2ForCausalLM with this config has, with its shape."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], hidden),
              "model.norm.weight": (hidden,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], hidden)
    per_layer = {
        "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q, hidden), "self_attn.q_proj.bias": (q,),
        "self_attn.k_proj.weight": (kv, hidden), "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.weight": (kv, hidden), "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (hidden, q),
        "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }
    for i in range(cfg["num_hidden_layers"]):
        for name, shape in per_layer.items():
            shapes[f"model.layers.{i}.{name}"] = shape
    return shapes


def _check_model(cfg: Mapping, shapes: Mapping[str, tuple[int, ...]], expected: Mapping,
                where: str) -> None:
    """Raise ModelPreparationError unless the config has the `expected` values
    and the tensors are exactly those (and shapes) that the config implies."""
    problems = [f"{key} is {cfg.get(key)!r}, expected {want!r}"
                for key, want in expected.items() if cfg.get(key) != want]
    if not problems:
        want_shapes = _expected_shapes(cfg)
        missing = sorted(set(want_shapes) - set(shapes))
        extra = sorted(set(shapes) - set(want_shapes))
        wrong = [f"{n} has shape {list(shapes[n])}, expected {list(want_shapes[n])}"
                 for n in want_shapes if n in shapes and tuple(shapes[n]) != want_shapes[n]]
        problems += ([f"missing tensors {missing[:3]}"] if missing else []) \
            + ([f"unexpected tensors {extra[:3]}"] if extra else []) + wrong[:3]
    if problems:
        raise ModelPreparationError(
            f"{where} is not the expected model: {'; '.join(problems)}. The GGUF differs from "
            f"the model this converter was told to expect: check the package name and version "
            f"pin; if they are right, delete the cached download and retry."
        )


# --- safetensors, written by hand so that a tensor never has to be in memory
# whole: the header needs only names, dtypes and shapes, which the GGUF gives
# before any data is read. Format: u64 little-endian header length, JSON
# header (padded with spaces to 8 bytes), then the tensors back to back.


def _safetensors_header(tensors: Sequence[_PlannedTensor]) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.hf_name] = {"dtype": "BF16", "shape": list(t.shape),
                             "data_offsets": [offset, offset + t.bf16_bytes]}
        offset += t.bf16_bytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def _dequantized_rows(gguf_file, t: _PlannedTensor, max_rows: int | None = None) -> Iterator:
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


def _write_shard(path: str, tensors: Sequence[_PlannedTensor], gguf_file, progress) -> None:
    import torch

    with open(path, "wb") as out:
        out.write(_safetensors_header(tensors))
        for t in tensors:
            for block in _dequantized_rows(gguf_file, t):
                # numpy has no bfloat16: write the raw 16-bit patterns.
                out.write(block.view(torch.int16).numpy())
            progress(t)


def _shards(tensors: Sequence[_PlannedTensor], shard_bytes: int) -> list[list[_PlannedTensor]]:
    shards: list[list[_PlannedTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.bf16_bytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.bf16_bytes
    return shards


def _write_safetensors(gguf_path: str, tensors: Sequence[_PlannedTensor], out_dir: str, *,
                      shard_bytes: int = _SHARD_BYTES, log: Log = print) -> list[str]:
    """Dequantize `tensors` into bf16 safetensors shards (plus the index when
    there is more than one); return the files written."""
    shards = _shards(tensors, shard_bytes)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)])
    total = sum(t.bf16_bytes for t in tensors)
    done = {"tensors": 0, "bytes": 0}
    start = time.time()

    def progress(t: _PlannedTensor) -> None:
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
        _write_json(os.path.join(out_dir, "model.safetensors.index.json"), index)
        names.append("model.safetensors.index.json")
    return names


def _write_json(path: str, obj) -> None:
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


def save_tokenizer(gguf_path: str, out_dir: str, log: Log = print) -> int:
    """Build the tokenizer (with the chat template) from the GGUF's metadata,
    save it into out_dir, check it works; return its length."""
    from transformers import AutoTokenizer

    gguf_dir, gguf_name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    if not tok.chat_template:
        raise ModelPreparationError(
            f"{gguf_path} has no usable tokenizer.chat_template; chat prompts would be "
            f"formatted wrongly. Use a GGUF that carries its chat template."
        )
    sample = "def add(a, b):\n    return a + b"
    decoded = tok.decode(tok.encode(sample, add_special_tokens=False))
    if decoded != sample:
        raise ModelPreparationError(
            f"the tokenizer built from {gguf_path} does not round-trip text "
            f"({sample!r} -> {decoded!r}); the installed transformers converts this GGUF's "
            f"tokenizer wrongly: try another transformers version."
        )
    # Rendering a prompt fails here, not in the first chat request, if the
    # template uses something this transformers' jinja setup lacks.
    tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                            add_generation_prompt=True)
    tok.save_pretrained(out_dir)
    log(f"tokenizer saved ({len(tok)} tokens, chat template included)")
    return len(tok)


def convert_gguf_to_hf(
    gguf_path: str,
    out_dir: str,
    *,
    expected: Mapping[str, object],
    generation_config: Mapping[str, object] | None = None,
    log: Log = print,
    shard_bytes: int = _SHARD_BYTES,
    tokenizer: Callable[[str, str, Log], int] | None = save_tokenizer,
    tied_embeddings_from: str | None = None,
) -> str:
    """Write a bf16 HF checkpoint of the GGUF model into out_dir (empty or
    absent; the caller renames it into place) and check it against `expected`
    (config.json keys). On failure out_dir is left empty: never a half model
    that loads. `tokenizer=None` skips the tokenizer (for toy GGUFs).
    `tied_embeddings_from` ("output.weight" or "token_embd.weight"): the model
    ties its head to its embedding but the GGUF stores the matrix twice; that
    copy becomes the one tied tensor (see _tie_embeddings)."""
    import gguf

    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise ModelPreparationError(
            f"{out_dir} is not empty; convert into a fresh directory (e.g. a temporary one "
            f"renamed into place afterwards)")
    created = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    start = time.time()
    try:
        reader = gguf.GGUFReader(gguf_path)
        if reader.byte_order != "I":
            # Tensor data is read straight from the file in host byte order.
            raise ModelPreparationError(
                f"{gguf_path} is a big-endian GGUF; use a little-endian one")
        arch = _field(reader, "general.architecture")
        if arch not in _ARCHITECTURES:
            raise ModelPreparationError(
                f"{gguf_path} is a {arch!r} GGUF; this converter knows only "
                f"{sorted(_ARCHITECTURES)}. Use the GGUF of a supported model.")
        tensors = _plan_tensors(reader, gguf_path)
        if tied_embeddings_from:
            tensors = _tie_embeddings(tensors, tied_embeddings_from, gguf_path)
        cfg = _build_config(reader, tensors)
        # Check before the minutes of dequantization, and again on the result.
        _check_model(cfg, {t.hf_name: t.shape for t in tensors}, expected, gguf_path)
        weights = sum(t.bf16_bytes for t in tensors)
        needed = weights + 50_000_000  # + tokenizer and json files
        _check_free_space(out_dir, needed, f"converting {os.path.basename(gguf_path)}")
        gen = dict(generation_config or _generation_config_from(cfg))
        del reader  # its memory map is not needed any more
        log(f"converting {gguf_path} ({len(tensors)} tensors, {weights / _GB:.2f} GB in bf16) "
            f"-> {out_dir}")
        with _disk_full_is_clear(out_dir, needed, f"converting {os.path.basename(gguf_path)}"):
            _write_safetensors(gguf_path, tensors, out_dir, shard_bytes=shard_bytes, log=log)
            n_tokens = tokenizer(gguf_path, out_dir, log) if tokenizer else None
            _write_json(os.path.join(out_dir, "generation_config.json"),
                        {**gen, "_from_model_config": False})
            # config.json last: without it nothing loads the directory.
            _write_json(os.path.join(out_dir, "config.json"), cfg)
        verify_checkpoint(out_dir, expected, n_tokens)
    except BaseException:
        _empty_dir(out_dir, remove=created)
        raise
    log(f"converted in {time.time() - start:.0f} s: {out_dir}")
    return out_dir


def _generation_config_from(cfg: Mapping) -> dict:
    return {k: cfg[k] for k in ("bos_token_id", "eos_token_id") if cfg.get(k) is not None}


def _empty_dir(path: str, remove: bool) -> None:
    if remove:
        shutil.rmtree(path, ignore_errors=True)
        return
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            os.remove(p)


def verify_checkpoint(model_dir: str, expected: Mapping[str, object],
                      tokenizer_len: int | None = None) -> None:
    """Check the written checkpoint as transformers reads it: config values,
    flat rope_theta, the tensor names and shapes in the safetensors files."""
    from transformers import AutoConfig

    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    cfg = AutoConfig.from_pretrained(model_dir).to_dict()
    _check_model(cfg, read_safetensors_shapes(model_dir), expected, model_dir)
    rope = (cfg.get("rope_parameters") or {}).get("rope_theta")
    if raw.get("rope_theta") != rope or rope is None:
        raise ModelPreparationError(
            f"{model_dir}/config.json: rope_theta {raw.get('rope_theta')!r} disagrees with "
            f"rope_parameters {rope!r} as transformers reads it; this is a converter bug")
    if tokenizer_len is not None and tokenizer_len > cfg["vocab_size"]:
        raise ModelPreparationError(
            f"{model_dir}: the tokenizer has {tokenizer_len} tokens but the embedding only "
            f"{cfg['vocab_size']} rows; the GGUF's tokenizer and weights do not belong together")
