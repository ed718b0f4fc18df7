"""Tiny random-weight HF checkpoints for tests (a helper, not a test module).

Each family gets the same small shape (hidden 128, 4 heads / 2 KV heads of
dim 32, MLP 256) so vLLM can start it on CPU quickly, while exercising the
family's own model code in vLLM (Qwen2 attention biases, Qwen3 q/k norms,
tied vs untied embeddings, ...). The tokenizer is copied from a real model
(the converted SmolLM2) so prompts and chat templates behave normally.

Weights are drawn with a large std (0.2 instead of the usual 0.02; 0.7 for
the embedding and output head): with the default init every next-token
distribution is nearly uniform (top-1 probability ~0.005), and tests comparing
outputs prove little. With these values the logits have std ~8
(sqrt(128) * 0.7), the top-1 probability averages ~0.6, and 32 greedy tokens
are nearly all distinct.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def _config_and_model_classes(family: str):
    import transformers as tf

    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
    }
    if family not in classes:
        raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")
    return classes[family]


def make_tiny_model(
    family: str,
    out_dir: str,
    *,
    num_layers: int = 4,
    seed: int = 0,
    tokenizer_src: str,
    std: float = 0.2,
    embed_std: float = 0.7,
    out_proj_std: float | None = None,
) -> str:
    """Write a random `family` checkpoint to `out_dir` (skipped if present).

    `out_proj_std` (default: `std`) sets the std of the projections that write
    into the residual stream (attention o_proj, MLP down_proj): a small value
    makes each sub-layer a small update, like in trained models, so that a draft
    with skipped sub-layers agrees with the full model part of the time.
    """
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir

    import torch
    from transformers import AutoTokenizer

    config_cls, model_cls = _config_and_model_classes(family)
    tok = AutoTokenizer.from_pretrained(tokenizer_src)
    config = config_cls(
        vocab_size=len(tok),
        # head_dim 32 is the smallest vLLM's CPU attention kernel supports
        # (16 fails at runtime: "Unsupported CPU attention configuration"),
        # and vLLM's Qwen2 ignores config.head_dim (uses hidden/heads), so
        # hidden = 4 * 32.
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        num_hidden_layers=num_layers,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        # Mix tied and untied output heads across families.
        tie_word_embeddings=family in ("llama", "qwen3"),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=std,
    )
    if family == "mistral":
        config.sliding_window = None  # MistralConfig defaults to 4096
    if family in ("qwen2", "qwen3"):
        config.max_window_layers = num_layers  # unused (no sliding window)
    config.architectures = [model_cls.__name__]

    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    # Randomize every parameter ourselves rather than trusting each family's
    # _init_weights: matrices and biases get N(0, std); norm weights get
    # 1 + noise so that a dropped/misloaded norm also changes the outputs.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name or "lm_head" in name:
                p.normal_(0.0, embed_std)
            elif out_proj_std is not None and ("o_proj" in name or "down_proj" in name):
                p.normal_(0.0, out_proj_std)
            else:
                p.normal_(0.0, std)

    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    # Build next to the target and rename, so an interrupted run never leaves
    # a directory with config.json but missing weights.
    tmp = tempfile.mkdtemp(prefix=".tiny-tmp-", dir=parent)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        # Also write the flat legacy key next to transformers 5's
        # rope_parameters, as in vllm_layerskip.tools.prepare_model.
        cfg_path = os.path.join(tmp, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
        # mkdtemp (and safetensors) create private files; keep them shareable.
        os.chmod(tmp, 0o755)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o644)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            # Another process won the race (or out_dir exists without config).
            if not os.path.isfile(os.path.join(out_dir, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


if __name__ == "__main__":
    import sys

    # python tests/tiny_models.py TOKENIZER_DIR OUT_ROOT [family ...]
    src, root, *fams = sys.argv[1:]
    for fam in fams or FAMILIES:
        print(make_tiny_model(fam, os.path.join(root, f"tiny-{fam}"), tokenizer_src=src))
