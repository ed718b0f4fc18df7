"""Convert a GGUF file into a Hugging Face checkpoint that vLLM and transformers
load directly: bfloat16 safetensors shards, config.json, generation_config.json
and the tokenizer with its chat template.

The conversion streams: each tensor is read from the GGUF file and dequantized
a few MB at a time and written straight into its place in a safetensors shard,
so memory stays far below the model size (transformers' own GGUF loading builds
an fp32 copy of the whole model first, 7 GB for a 1.5B model; peak RSS here:
1.1 GB, in the tokenizer's construction).

Its parts: which GGUF tensor becomes which HF tensor, and reading their data
(gguf_tensors.py); config.json from the GGUF's metadata (gguf_config.py); the
safetensors shards and JSON files (checkpoint_files.py); whether the result is
the model expected (checkpoint_check.py). Here: the tokenizer and the whole.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Callable, Mapping

from vllm_layerskip.tools.checkpoint_check import check_model, verify_checkpoint
from vllm_layerskip.tools.checkpoint_files import SHARD_BYTES, write_json, write_safetensors
from vllm_layerskip.tools.gguf_config import build_config, generation_config_from
from vllm_layerskip.tools.gguf_parts import (
    _GB,
    Log,
    ModelPreparationError,
    _check_free_space,
    _disk_full_is_clear,
)
from vllm_layerskip.tools.gguf_tensors import (
    ARCHITECTURES,
    gguf_field,
    plan_tensors,
    tie_embeddings,
)


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
    shard_bytes: int = SHARD_BYTES,
    tokenizer: Callable[[str, str, Log], int] | None = save_tokenizer,
    tied_embeddings_from: str | None = None,
) -> str:
    """Write a bf16 HF checkpoint of the GGUF model into out_dir (empty or
    absent; the caller renames it into place) and check it against `expected`
    (config.json keys). On failure out_dir is left empty: never a half model
    that loads. `tokenizer=None` skips the tokenizer (for toy GGUFs).
    `tied_embeddings_from` ("output.weight" or "token_embd.weight"): the model
    ties its head to its embedding but the GGUF stores the matrix twice; that
    copy becomes the one tied tensor (see tie_embeddings)."""
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
        arch = gguf_field(reader, "general.architecture")
        if arch not in ARCHITECTURES:
            raise ModelPreparationError(
                f"{gguf_path} is a {arch!r} GGUF; this converter knows only "
                f"{sorted(ARCHITECTURES)}. Use the GGUF of a supported model.")
        tensors = plan_tensors(reader, gguf_path)
        if tied_embeddings_from:
            tensors = tie_embeddings(tensors, tied_embeddings_from, gguf_path)
        cfg = build_config(reader, tensors)
        # Check before the minutes of dequantization, and again on the result.
        check_model(cfg, {t.hf_name: t.shape for t in tensors}, expected, gguf_path)
        weights = sum(t.bf16_bytes for t in tensors)
        needed = weights + 50_000_000  # + tokenizer and json files
        _check_free_space(out_dir, needed, f"converting {os.path.basename(gguf_path)}")
        gen = dict(generation_config or generation_config_from(cfg))
        del reader  # its memory map is not needed any more
        log(f"converting {gguf_path} ({len(tensors)} tensors, {weights / _GB:.2f} GB in bf16) "
            f"-> {out_dir}")
        with _disk_full_is_clear(out_dir, needed, f"converting {os.path.basename(gguf_path)}"):
            write_safetensors(gguf_path, tensors, out_dir, shard_bytes=shard_bytes, log=log)
            n_tokens = tokenizer(gguf_path, out_dir, log) if tokenizer else None
            write_json(os.path.join(out_dir, "generation_config.json"),
                       {**gen, "_from_model_config": False})
            # config.json last: without it nothing loads the directory.
            write_json(os.path.join(out_dir, "config.json"), cfg)
        verify_checkpoint(out_dir, expected, n_tokens)
    except BaseException:
        _empty_dir(out_dir, remove=created)
        raise
    log(f"converted in {time.time() - start:.0f} s: {out_dir}")
    return out_dir


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
