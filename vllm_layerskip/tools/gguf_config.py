"""config.json and generation_config.json for a GGUF file's model, from its
metadata and its tensors' shapes."""

from __future__ import annotations

from typing import Mapping, Sequence

from vllm_layerskip.tools.gguf_parts import ModelPreparationError
from vllm_layerskip.tools.gguf_tensors import ARCHITECTURES, PlannedTensor, gguf_field


def _as_float(value) -> float:
    # GGUF stores floats as float32: 1e-6 arrives as 9.999999974752427e-07.
    # str() of the float32 is its shortest round-trip repr ("1e-06").
    import numpy as np

    return float(str(np.float32(value)))


def build_config(reader, tensors: Sequence[PlannedTensor], torch_dtype: str = "bfloat16") -> dict:
    """config.json contents for the GGUF's model (metadata + tensor shapes)."""
    from transformers import AutoConfig

    arch = gguf_field(reader, "general.architecture")
    shapes = {t.hf_name: t.shape for t in tensors}
    vocab_size, hidden_size = shapes["model.embed_tokens.weight"]

    def meta(key, default=None):
        value = gguf_field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelPreparationError(
                f"GGUF metadata lacks {arch}.{key}; cannot build config.json")
        return value

    rope_theta = _as_float(meta("rope.freq_base", 10000.0))
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    bos = gguf_field(reader, "tokenizer.ggml.bos_token_id")
    config = AutoConfig.for_model(
        arch,
        architectures=[ARCHITECTURES[arch]],
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


def generation_config_from(cfg: Mapping) -> dict:
    return {k: cfg[k] for k in ("bos_token_id", "eos_token_id") if cfg.get(k) is not None}
