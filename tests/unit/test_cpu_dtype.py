"""The start-up warning for bf16 on a CPU without bf16 arithmetic (core/cpu_dtype.py)."""

from vllm_layerskip.core.cpu_dtype import bf16_without_arithmetic_warning, cpu_flags

AVX2_EPYC = {"fpu", "sse2", "avx", "avx2", "fma", "f16c"}


def test_bf16_on_avx2_without_bf16_arithmetic_is_warned_about():
    text = bf16_without_arithmetic_warning("bfloat16", AVX2_EPYC)
    assert text.startswith("bfloat16 on a CPU without bf16 arithmetic (no AVX512-BF16 or AMX)")
    assert "try --dtype float32 and compare" in text


def test_no_warning_where_bf16_arithmetic_exists_or_the_dtype_is_another():
    assert bf16_without_arithmetic_warning("bfloat16", AVX2_EPYC | {"avx512f", "avx512_bf16"}) is None
    assert bf16_without_arithmetic_warning("bfloat16", AVX2_EPYC | {"amx_bf16", "amx_tile"}) is None
    assert bf16_without_arithmetic_warning("float32", AVX2_EPYC) is None
    assert bf16_without_arithmetic_warning("float16", AVX2_EPYC) is None


def test_no_warning_on_other_architectures_or_unknown_flags():
    assert bf16_without_arithmetic_warning("bfloat16", None) is None  # no flags line (aarch64)
    assert bf16_without_arithmetic_warning("bfloat16", {"fp", "asimd", "bf16"}) is None


def test_cpu_flags_reads_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2 fma avx512_bf16\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "fma"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(str(arm)) is None
    assert cpu_flags(str(tmp_path / "missing")) is None
