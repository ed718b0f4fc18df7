"""The CPU expand-kernel replacement (see patches/cpu_sampler.py)."""

import torch

from vllm_layerskip.patches.cpu_sampler import expand_kernel_impl


def test_expands_float_values_in_place():
    # Per-request temperatures -> per-draft-token temperatures; 0 (greedy) -> 1.
    out = torch.full((6,), float("nan"))
    expand_kernel_impl(out, torch.tensor([0.7, 0.0, 1.3]), torch.tensor([2, 5, 6]), 0, 1)
    assert torch.equal(out, torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.3]))


def test_expands_integers_and_skips_requests_without_drafts():
    out = torch.full((3,), -5, dtype=torch.int32)
    expand_kernel_impl(out, torch.tensor([4, 9, 7], dtype=torch.int32),
                       torch.tensor([1, 1, 3], dtype=torch.int32), 0, 0)
    assert out.tolist() == [4, 7, 7]


def test_the_plugin_installs_the_fix_where_vllm_registers_cpu_kernels():
    from vllm.platforms import current_platform
    from vllm.utils import cpu_triton_utils

    import vllm_layerskip

    vllm_layerskip.register()
    if current_platform.is_cpu():
        assert cpu_triton_utils._expand_kernel_impl is expand_kernel_impl
