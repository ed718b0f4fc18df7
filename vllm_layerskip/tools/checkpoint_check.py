"""Whether a converted model is the model expected: its config values, and
exactly the tensors (and shapes) a Qwen2ForCausalLM of that config has, checked
on the plan before a conversion and on the written checkpoint after it."""

from __future__ import annotations

import json
import os
from typing import Mapping

from vllm_layerskip.tools.checkpoint_files import read_safetensors_shapes
from vllm_layerskip.tools.gguf_parts import ModelPreparationError


def expected_shapes(cfg: Mapping) -> dict[str, tuple[int, ...]]:
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


def check_model(cfg: Mapping, shapes: Mapping[str, tuple[int, ...]], expected: Mapping,
                where: str) -> None:
    """Raise ModelPreparationError unless the config has the `expected` values
    and the tensors are exactly those (and shapes) that the config implies."""
    problems = [f"{key} is {cfg.get(key)!r}, expected {want!r}"
                for key, want in expected.items() if cfg.get(key) != want]
    if not problems:
        want_shapes = expected_shapes(cfg)
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


def verify_checkpoint(model_dir: str, expected: Mapping[str, object],
                      tokenizer_len: int | None = None) -> None:
    """Check the written checkpoint as transformers reads it: config values,
    flat rope_theta, the tensor names and shapes in the safetensors files."""
    from transformers import AutoConfig

    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    cfg = AutoConfig.from_pretrained(model_dir).to_dict()
    check_model(cfg, read_safetensors_shapes(model_dir), expected, model_dir)
    rope = (cfg.get("rope_parameters") or {}).get("rope_theta")
    if raw.get("rope_theta") != rope or rope is None:
        raise ModelPreparationError(
            f"{model_dir}/config.json: rope_theta {raw.get('rope_theta')!r} disagrees with "
            f"rope_parameters {rope!r} as transformers reads it; this is a converter bug")
    if tokenizer_len is not None and tokenizer_len > cfg["vocab_size"]:
        raise ModelPreparationError(
            f"{model_dir}: the tokenizer has {tokenizer_len} tokens but the embedding only "
            f"{cfg['vocab_size']} rows; the GGUF's tokenizer and weights do not belong together")
