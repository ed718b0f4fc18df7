"""`vllm-layerskip recommend`: the rule, and the command's output."""

import json

import pytest

from vllm_layerskip.tools.cli import main
from vllm_layerskip.tools.recommend import recommend

AVX512_BF16 = {"avx2", "avx512f", "avx512_bf16"}
AVX2_ONLY = {"avx2", "fma"}


VNNI = AVX512_BF16 | {"avx512bw", "avx512vl", "avx512_vnni"}


def test_bf16_with_vnni_drafts_on_the_int4_kernel_up_to_4_requests_and_w8a8_above():
    for n in (1, 4):
        r = recommend(None, "bfloat16", n, flags=VNNI, gpu=False, has_profile=True,
                      int4_kernel=True)
        assert r.spec == {"method": "quantized", "num_speculative_tokens": 8,
                          "draft_weights": "int4"}
        assert any("the project's int4 kernel drafts a token" in line for line in r.reasons)
    many = recommend(None, "bfloat16", 16, flags=VNNI, gpu=False, has_profile=True,
                     int4_kernel=True)
    assert many.spec["draft_weights"] == "w8a8"
    assert any("16 request(s) in flight (over 4" in line for line in many.reasons)


def test_bf16_with_vnni_but_no_compiler_drafts_on_w8a8_at_any_load():
    for n in (1, 16):
        r = recommend(None, "bfloat16", n, flags=VNNI, gpu=False, has_profile=True,
                      int4_kernel=False)
        assert r.spec["draft_weights"] == "w8a8"
    one = recommend(None, "bfloat16", 1, flags=VNNI, gpu=False, has_profile=True,
                    int4_kernel=False)
    assert any("without a C compiler" in line and "install gcc" in line for line in one.reasons)


def test_the_int4_kernel_is_looked_up_from_the_flags_and_the_compiler(monkeypatch):
    from vllm_layerskip.core import int4_kernels

    monkeypatch.setattr(int4_kernels, "compiler", lambda: "/usr/bin/gcc")
    assert recommend(None, "bfloat16", 1, flags=VNNI, gpu=False,
                     has_profile=True).spec["draft_weights"] == "int4"
    monkeypatch.setattr(int4_kernels, "compiler", lambda: None)
    assert recommend(None, "bfloat16", 1, flags=VNNI, gpu=False,
                     has_profile=True).spec["draft_weights"] == "w8a8"


def test_bf16_on_a_cpu_with_bf16_arithmetic_drafts_every_layer_at_4_bits():
    r = recommend(None, "bfloat16", 1, flags=AVX512_BF16, gpu=False, has_profile=True)
    assert r.spec == {"method": "quantized", "num_speculative_tokens": 8, "draft_weights": "int4"}
    assert r.dtype == "bfloat16"
    # Many requests in flight: int4 serves passes of up to 4 tokens, w8a8 any.
    assert recommend(None, "bfloat16", 4, flags=AVX512_BF16, gpu=False,
                     has_profile=True).spec["draft_weights"] == "int4"
    many = recommend(None, "bfloat16", 16, flags=AVX512_BF16, gpu=False, has_profile=True)
    assert many.spec["draft_weights"] == "w8a8"
    assert any("16 request(s) in flight" in line for line in many.reasons)


def test_bf16_without_bf16_arithmetic_is_told_to_serve_float32():
    r = recommend(None, "bfloat16", 1, flags=AVX2_ONLY, gpu=False, has_profile=True)
    assert r.dtype == "float32"
    assert r.spec == {"method": "self_sd", "profile": "shipped", "num_speculative_tokens": 8}
    assert any("no bf16 arithmetic" in line for line in r.reasons)


@pytest.mark.parametrize("gpu,dtype", [(True, "bfloat16"), (False, "float32")])
def test_the_models_own_weights_self_sd_where_a_profile_ships_else_swift(gpu, dtype):
    shipped = recommend(None, dtype, 1, flags=AVX512_BF16, gpu=gpu, has_profile=True)
    assert shipped.spec["method"] == "self_sd" and "draft_weights" not in shipped.spec
    learned = recommend(None, dtype, 1, flags=AVX512_BF16, gpu=gpu, has_profile=False)
    assert learned.spec == {"method": "swift", "num_speculative_tokens": 8}
    assert any("swift learns a set while serving" in line for line in learned.reasons)


def test_the_command_prints_reasons_then_the_config_as_its_last_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert main(["recommend", "--model", str(tmp_path), "--dtype", "float32"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert all(line.startswith("# ") for line in lines[:-1]) and len(lines) >= 2
    spec = json.loads(lines[-1])
    assert spec["method"] in ("swift", "self_sd") and spec["num_speculative_tokens"] == 8
    # The checkpoint's dtype when none is given.
    assert main(["recommend", "--model", str(tmp_path)]) == 0
    assert "dtype bfloat16: the checkpoint's own" in capsys.readouterr().out


def test_the_command_refuses_a_model_it_cannot_find():
    with pytest.raises(SystemExit, match="neither a known model"):
        main(["recommend", "--model", "/no/such/checkpoint"])
    with pytest.raises(SystemExit, match="--max-concurrency must be 1 or more"):
        main(["recommend", "--max-concurrency", "0"])
