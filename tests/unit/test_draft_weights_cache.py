"""The on-disk cache of quantized draft copies (core/draft_weights_cache.py): a
hit gives the copy a fresh quantization would, a damaged or foreign file is
never used, another weight misses, and no reader sees a half-written file."""

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from vllm_layerskip.core import draft_weights, draft_weights_cache
from vllm_layerskip.core.draft_weights import QuantizedLinear


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, every weight cached; yields the folder."""
    monkeypatch.setenv(draft_weights_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(draft_weights_cache.DISABLE_ENV, raising=False)
    monkeypatch.setattr(draft_weights_cache, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(draft_weights_cache, "_write_failed", False)
    return tmp_path / draft_weights_cache.SUBDIR


@pytest.fixture
def warnings_logged():
    """The plugin's warnings, as logged through vLLM's logger tree."""
    lines = []

    class Handler(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Handler(level=logging.WARNING)
    logger = logging.getLogger("vllm.layerskip")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def layer_of(weight: torch.Tensor) -> nn.Module:
    layer = nn.Module()
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.bias = None
    return layer


def random_layer(rows=64, k=128, seed=0, dtype=torch.bfloat16) -> nn.Module:
    torch.manual_seed(seed)
    return layer_of((torch.randn(rows, k) * 0.05).to(dtype))


def count_builds(monkeypatch) -> list:
    """Counts calls of the quantizers (a cache hit makes none)."""
    calls = []
    for name in ("_quantize_int4", "_quantize_int8"):
        original = getattr(draft_weights, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(draft_weights, name, counted)
    return calls


def files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*")) if folder.exists() else []


@pytest.mark.parametrize("scheme", ["int4", "int8", "w8a8"])
def test_a_hit_gives_the_copy_a_fresh_quantization_gives(cache, monkeypatch, scheme):
    layer = random_layer()
    builds = count_builds(monkeypatch)
    first = QuantizedLinear(layer, scheme)
    assert builds and len(files(cache)) == 1
    builds.clear()
    second = QuantizedLinear(layer, scheme)
    assert builds == []  # read back, not quantized again
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    assert torch.equal(first.matmul(x), second.matmul(x))
    if scheme != "w8a8":  # w8a8's packed weight is a kernel's own: its outputs are compared
        assert torch.equal(first.packed, second.packed) and torch.equal(first.scales, second.scales)
    monkeypatch.setenv(draft_weights_cache.DISABLE_ENV, "0")
    fresh = QuantizedLinear(layer, scheme)
    assert torch.equal(fresh.matmul(x), second.matmul(x))


def test_int8_and_w8a8_share_an_entry_and_int4_grids_do_not(cache, monkeypatch):
    layer = random_layer()
    QuantizedLinear(layer, "int8")
    builds = count_builds(monkeypatch)
    QuantizedLinear(layer, "w8a8")
    assert builds == [] and len(files(cache)) == 1
    QuantizedLinear(layer, "int4", "auto")
    QuantizedLinear(layer, "int4", "minmax")
    assert builds == ["_quantize_int4", "_quantize_int4"] and len(files(cache)) == 3


def test_the_file_holds_4_bit_values_not_the_cpus_packed_layout(cache, monkeypatch):
    from vllm_layerskip.core import int4_kernels

    monkeypatch.setenv(int4_kernels.ENV, "torch")  # read back below in torch's scales layout
    layer = random_layer()
    copy = QuantizedLinear(layer, "int4")
    from safetensors import safe_open

    (path,) = files(cache)
    with safe_open(str(path), framework="pt") as f:
        q, meta = f.get_tensor("q"), f.metadata()
    assert q.dtype == torch.uint8 and q.shape == (64, 64)  # two 4-bit values a byte
    assert meta["format"] == draft_weights_cache.FORMAT and meta["version"] == "1"
    assert f'"torch": "{torch.__version__}"' in meta["fields"]
    # Read back through torch's kernel, the stored values are the copy's.
    levels = torch.stack([q & 15, q >> 4], dim=-1).reshape(64, 128).float()
    scales = copy.scales.float()  # [k / 32, n, (scale, zero)]
    scale = scales[..., 0].T.repeat_interleave(32, dim=1)
    zero = scales[..., 1].T.repeat_interleave(32, dim=1)
    eye = torch.eye(128, dtype=torch.bfloat16)
    assert torch.allclose(((levels - 8) * scale + zero), copy.matmul(eye).T.float(), atol=2e-3)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "empty", "foreign"])
def test_a_damaged_or_foreign_file_is_rebuilt_with_a_warning(cache, monkeypatch, warnings_logged,
                                                             damage):
    layer = random_layer()
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    want = QuantizedLinear(layer, "int4").matmul(x)
    (path,) = files(cache)
    data = bytearray(path.read_bytes())
    if damage == "flipped byte":
        data[-5] ^= 0x10
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(bytes(data[: len(data) * 2 // 3]))
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a valid safetensors file that is not ours
        from safetensors.torch import save_file

        save_file({"q": torch.zeros(64, 64, dtype=torch.uint8)}, str(path),
                  metadata={"format": "someone-else"})
    builds = count_builds(monkeypatch)
    copy = QuantizedLinear(layer, "int4")
    assert builds == ["_quantize_int4"]  # the file was not used
    assert torch.equal(copy.matmul(x), want)
    (line,) = warnings_logged
    assert line.startswith(f"vllm-layerskip: draft-weights cache file '{path}' ")
    assert line.endswith("; making the copy again and rewriting the file.")
    expected = {"flipped byte": "fails its checksum", "truncated": "is not a readable safetensors",
                "empty": "is not a readable safetensors", "foreign": "is not a draft-weights cache file"}
    assert expected[damage] in line
    # Rewritten: the next start reads it without a word.
    builds.clear()
    QuantizedLinear(layer, "int4")
    assert builds == [] and len(warnings_logged) == 1


def test_a_file_renamed_to_another_weights_name_is_not_used(cache, monkeypatch, warnings_logged):
    a, b = random_layer(seed=1), random_layer(seed=2)
    QuantizedLinear(a, "int4")
    (path_a,) = files(cache)
    QuantizedLinear(b, "int4")
    (path_b,) = [p for p in files(cache) if p != path_a]
    path_b.write_bytes(path_a.read_bytes())  # b's name, a's copy
    builds = count_builds(monkeypatch)
    QuantizedLinear(b, "int4")
    assert builds == ["_quantize_int4"]
    assert "holds the copy of another weight" in warnings_logged[0]


def test_a_different_weight_misses(cache, monkeypatch):
    layer = random_layer()
    QuantizedLinear(layer, "int4")
    builds = count_builds(monkeypatch)
    changed = layer.weight.detach().clone()
    changed[37, 101] += 0.01  # one weight of 8192
    QuantizedLinear(layer_of(changed), "int4")
    assert builds == ["_quantize_int4"] and len(files(cache)) == 2
    QuantizedLinear(layer_of(layer.weight.detach().float()), "int4")  # same values, float32
    assert len(builds) == 2 and len(files(cache)) == 3


def test_the_write_is_atomic(cache, monkeypatch, warnings_logged):
    """The copy is written under a temporary name and renamed: a write that
    fails half-way leaves nothing under the final name, and no temporary file."""
    from safetensors import torch as safetensors_torch

    seen = []

    def half_written(tensors, filename, metadata=None):
        seen.append((Path(filename), files(cache)))
        Path(filename).write_bytes(b"\x00" * 100)  # part of a file, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors_torch, "save_file", half_written)
    layer = random_layer()
    copy = QuantizedLinear(layer, "int4")  # the copy itself is still made
    ((tmp, present),) = seen
    assert tmp.parent == cache and tmp.name.startswith(".") and tmp.suffix == ".tmp"
    assert present == [tmp]  # while writing, only the temporary file exists
    assert files(cache) == []  # nothing under the final name, the temporary file removed
    assert copy.scheme == "int4"
    assert len(warnings_logged) == 1 and "cannot write the draft-weights cache" in warnings_logged[0]
    QuantizedLinear(random_layer(seed=5), "int4")
    assert len(warnings_logged) == 1  # once a process


def test_a_successful_write_leaves_only_the_final_file(cache):
    QuantizedLinear(random_layer(), "int4")
    (path,) = files(cache)
    assert path.name.startswith("int4-") and path.suffix == ".safetensors"


def test_turned_off_nothing_is_read_or_written(cache, monkeypatch):
    monkeypatch.setenv(draft_weights_cache.DISABLE_ENV, "0")
    QuantizedLinear(random_layer(), "int4")
    assert files(cache) == [] and draft_weights_cache.folder() is None


def test_the_cache_folder_is_the_projects(tmp_path, monkeypatch):
    from vllm_layerskip.tools.prepare_model import CACHE_ENV

    assert draft_weights_cache.CACHE_ENV == CACHE_ENV
    monkeypatch.delenv(draft_weights_cache.DISABLE_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert draft_weights_cache.folder() == tmp_path / "draft_weights"
    monkeypatch.delenv(CACHE_ENV)
    assert draft_weights_cache.folder() == Path.home() / ".cache" / "vllm_layerskip" / "draft_weights"


def test_small_weights_are_not_cached(cache, monkeypatch):
    monkeypatch.setattr(draft_weights_cache, "MIN_ELEMENTS", 64 * 128 + 1)
    QuantizedLinear(random_layer(), "int4")
    assert files(cache) == []
