"""kernels/clasp_dp.py: the torch reference by hand, the Triton kernel against it.

Triton's CPU interpreter needs TRITON_INTERPRET=1 before `import triton` (tl.sum,
tl.zeros, ... are @triton.jit functions decorated at import), and other test
modules import vLLM, which imports triton. So the kernel runs in a subprocess: this file run as a script
writes inputs and kernel outputs to a file, and the tests compare them with
dp_select_torch here. The pytest process's environment is never touched.
On a machine with a CUDA GPU the subprocess runs the compiled kernel on the GPU
instead (no interpreter), and the GPU-only tests below run too: the same file
checks the kernel as CI runs it and as a GPU runs it.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
import zlib

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from vllm_layerskip.kernels.clasp_dp import dp_select, dp_select_torch  # noqa: E402

NEG_INF = float("-inf")

# Kernel cases: 576 = SmolLM2's hidden size. block_h None picks next_pow2(H) (masked
# tail in one block); 64 and 256 loop over several blocks, with and without a tail.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CASES = [f"{d}-H{h}-J{j}-B{b}" for d, h, j, b in itertools.product(DTYPES, (576, 100, 1), (1, 5, 13), ("auto", 64, 256))]
CASES += ["fp16-H576-J13-Bauto", "fp32-H100-J13-Bstrided"]


def make_case(name: str) -> dict:
    """Deterministic inputs for one case. Candidates are target + noise of varied size,
    so cosines spread over (0, 1) like real hidden states; a few rows are invalid,
    one is a tie (skipped == computed), and rows past the reachable ones are invalid."""
    dtype_name, h, j, b = name.split("-")
    dtype, H, J = {**DTYPES, "fp16": torch.float16}[dtype_name], int(h[1:]), int(j[1:])
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    target = torch.randn(H, generator=g)
    scale_c = torch.rand(J, 1, generator=g) * 3
    scale_s = torch.rand(J, 1, generator=g) * 3
    computed = target + scale_c * torch.randn(J, H, generator=g)
    skipped = target + scale_s * torch.randn(J, H, generator=g)
    computed_valid = torch.rand(J, generator=g) > 0.15
    skipped_valid = torch.rand(J, generator=g) > 0.15
    skipped_valid[0] = False  # g(i-1, -1) does not exist
    if J >= 5:
        computed_valid[-1] = skipped_valid[-1] = False  # j > i: unreachable
        computed_valid[2] = skipped_valid[2] = True
        skipped[2] = computed[2]  # exact tie -> "computed"
    if b == "Bstrided":  # rows that are slices of a wider table
        computed = torch.cat([computed, torch.randn(J, 7, generator=g)], 1)[:, :H]
        assert computed.stride(0) == H + 7
    block_h = None if b in ("Bauto", "Bstrided") else int(b[1:])
    return dict(computed=computed.to(dtype), skipped=skipped.to(dtype), target=target.to(dtype),
                computed_valid=computed_valid, skipped_valid=skipped_valid, block_h=block_h)


GPU = torch.cuda.is_available()
on_gpu_only = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (CI here has none)")


def run_kernel_cases(out_path: str, device: str) -> None:
    """Subprocess side: run the kernel on every case, under TRITON_INTERPRET=1
    (device "cpu") or compiled on the GPU (device "cuda"); results on the CPU."""
    from vllm_layerskip.kernels import clasp_dp

    def on(case):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}

    results = {}
    for name in CASES:
        case = make_case(name)
        block_h = case.pop("block_h")
        got = clasp_dp.dp_select_triton(**on(case), block_h=block_h)
        results[name] = (case, tuple(t.cpu() for t in got))

    # Under TRITON_INTERPRET=1 the dispatcher must pick Triton even for CPU
    # tensors, and on a GPU for CUDA tensors.
    def torch_forbidden(*args, **kwargs):
        raise AssertionError("dp_select chose torch")

    clasp_dp.dp_select_torch = torch_forbidden
    case = {k: v for k, v in make_case(CASES[-1]).items() if k != "block_h"}
    clasp_dp.dp_select(**on(case))
    torch.save({"cases": results, "dispatch_ok": True, "device": device}, out_path)


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("clasp_dp") / "results.pt")
    device = "cuda" if GPU else "cpu"
    env = {**os.environ, "PYTHONPATH": ROOT}
    if GPU:
        env.pop("TRITON_INTERPRET", None)
    else:
        env["TRITON_INTERPRET"] = "1"
    t0 = time.time()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), out, device], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    how = "compiled, on the GPU" if GPU else "interpreted"
    print(f"\n{len(CASES)} kernel launches ({how}) + startup: {time.time() - t0:.1f} s")
    results = torch.load(out)
    assert results["device"] == device
    return results


@pytest.mark.parametrize("name", CASES)
def test_triton_matches_reference(kernel_results, name):
    inputs, (states, took_skip, score) = kernel_results["cases"][name]
    ref_states, ref_skip, ref_score = dp_select_torch(**inputs)
    assert states.dtype == inputs["computed"].dtype and took_skip.dtype == torch.bool
    assert score.dtype == torch.float32

    # Compare choices only where the two cosines are not razor-close: the kernel
    # sums in a different order than torch. Exact ties stay in (both see equal sums).
    cos = lambda x: torch.nn.functional.cosine_similarity(x.float(), inputs["target"].float(), dim=-1)
    margin = (cos(inputs["computed"]) - cos(inputs["skipped"])).abs()
    tol = 1e-5 if inputs["computed"].dtype == torch.float32 else 1e-3
    decided = (margin > tol) | (margin == 0) | ~inputs["computed_valid"] | ~inputs["skipped_valid"]
    assert decided.float().mean() > 0.5, "test inputs too close to call"
    assert torch.equal(took_skip[decided], ref_skip[decided])
    assert torch.equal(states[decided], ref_states[decided])
    # Every row holds one of its two candidates, bit-exact, as took_skip says.
    chosen = torch.where(took_skip[:, None], inputs["skipped"], inputs["computed"])
    assert torch.equal(states, chosen)
    torch.testing.assert_close(score, ref_score, rtol=0, atol=1e-4 if tol == 1e-5 else 1e-2)


def test_dispatch_under_interpreter(kernel_results):
    assert kernel_results["dispatch_ok"]


# --- torch reference, by hand ---

def _valid(*bits):
    return torch.tensor(bits, dtype=torch.bool)


def test_reference_hand_computed():
    t = torch.tensor([1.0, 0.0])
    computed = torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, 0.0]])
    skipped = torch.tensor([[5.0, 0.0], [3.0, 0.0], [1.0, 0.0]])
    states, took_skip, score = dp_select_torch(computed, skipped, t, _valid(1, 1, 1), _valid(0, 1, 1))
    # row 0: skipped would win (cos 1) but is invalid (j = 0); row 1: skipped points
    # along the target and wins, 1 vs 0; row 2: both cos 1, the tie goes to computed.
    assert took_skip.tolist() == [False, True, False]
    torch.testing.assert_close(score, torch.tensor([2 ** -0.5, 1.0, 1.0]))
    assert torch.equal(states, torch.stack([computed[0], skipped[1], computed[2]]))


def test_reference_invalid_never_wins():
    t = torch.tensor([0.0, 1.0, 0.0])
    perfect, poor = t.clone(), torch.tensor([0.0, -1.0, 0.0])
    computed = torch.stack([perfect, poor, perfect])
    skipped = torch.stack([poor, perfect, perfect])
    states, took_skip, score = dp_select_torch(computed, skipped, t, _valid(0, 1, 0), _valid(1, 0, 0))
    assert took_skip.tolist() == [True, False, False]  # the valid one wins, even if worse
    assert score[:2].tolist() == [-1.0, -1.0]
    assert score[2].item() == NEG_INF  # neither valid
    assert torch.equal(states, torch.stack([poor, poor, perfect]))  # row 2: computed row


def test_reference_zero_rows_and_dtypes():
    # EPS keeps an all-zero row at cosine 0 rather than NaN.
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    computed = torch.zeros(1, 3, dtype=torch.bfloat16)
    skipped = -t[None]
    states, took_skip, score = dp_select_torch(computed, skipped, t, _valid(1), _valid(1))
    assert score.dtype == torch.float32 and states.dtype == torch.bfloat16
    assert took_skip.tolist() == [False] and score.tolist() == [0.0]


def test_dispatcher_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = {k: v for k, v in make_case("fp32-H100-J5-Bauto").items() if k != "block_h"}
    ref = dp_select_torch(**case)
    for backend in (None, "torch"):  # CPU without the interpreter -> torch
        got = dp_select(**case, backend=backend)
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
    with pytest.raises(ValueError):
        dp_select(**case, backend="cuda")


# --- on a GPU only: the kernel inside CLaSp's whole DP, and at scale ---

def _random_residual_layers(num_layers: int, hidden: int, device: str, seed: int = 0):
    """Residual layers h + W_i tanh(h): skip choices that differ from layer to layer."""
    g = torch.Generator().manual_seed(seed)
    weights = [(torch.randn(hidden, hidden, generator=g) * (0.3 + 0.1 * (i % 4)) / hidden ** 0.5)
               .to(device) for i in range(num_layers)]

    def layer(i, states):
        return states + torch.tanh(states) @ weights[i].T

    return layer


@on_gpu_only
@pytest.mark.parametrize("num_reqs", [1, 4])
def test_clasp_dp_picks_the_same_layers_with_the_gpu_kernel(num_reqs, monkeypatch):
    # The DP on CUDA tensors dispatches every layer step to the Triton kernel;
    # forcing the torch reference must give the same skip set and score.
    from vllm_layerskip.kernels import clasp_dp as kernel_module
    from vllm_layerskip.methods.clasp import layer_dp

    num_layers, hidden = 30, 576  # SmolLM2's shape
    layer = _random_residual_layers(num_layers, hidden, "cuda")
    x0 = torch.randn(num_reqs, hidden, generator=torch.Generator().manual_seed(1)).cuda()
    calls = []
    real_triton = kernel_module.dp_select_triton

    def counting_triton(*args, **kwargs):
        calls.append(1)
        return real_triton(*args, **kwargs)

    monkeypatch.setattr(kernel_module, "dp_select_triton", counting_triton)
    on_gpu = layer_dp.clasp_dp(layer, x0, num_layers, 12, frozenset({0, 29}))
    assert len(calls) == num_layers  # one kernel launch per layer step
    monkeypatch.setattr(layer_dp, "dp_select",
                        lambda *a, **k: kernel_module.dp_select(*a, **k, backend="torch"))
    reference = layer_dp.clasp_dp(layer, x0, num_layers, 12, frozenset({0, 29}))
    assert on_gpu.skipped == reference.skipped
    assert on_gpu.score == pytest.approx(reference.score, abs=1e-5)


@on_gpu_only
@pytest.mark.parametrize("hidden,num_cells", [(576, 30), (4096, 64), (8192, 80)])
def test_gpu_kernel_at_model_sizes(hidden, num_cells):
    # Hidden sizes of SmolLM2, Llama-3-8B and Llama-3-70B; rows as many as layers.
    g = torch.Generator().manual_seed(hidden)
    target = torch.randn(hidden, generator=g)
    computed = (target + torch.randn(num_cells, hidden, generator=g)).to(torch.bfloat16)
    skipped = (target + 1.5 * torch.randn(num_cells, hidden, generator=g)).to(torch.bfloat16)
    valid = torch.ones(num_cells, dtype=torch.bool)
    args = [t.cuda() for t in (computed, skipped, target.to(torch.bfloat16), valid, valid)]
    states, took_skip, score = dp_select(*args)
    ref_states, ref_skip, ref_score = dp_select_torch(*args)
    assert torch.equal(took_skip, ref_skip) and torch.equal(states, ref_states)
    torch.testing.assert_close(score, ref_score, rtol=0, atol=1e-3)


if __name__ == "__main__":
    run_kernel_cases(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "cpu")
