"""The source-only hook check (vllm_layerskip/hook_points.py, scripts/check_vllm_hooks.py).

No engine, no network, no vLLM import: the installed vLLM's files are parsed, and
copies of a few of them are edited to show that a renamed parameter, a deleted
method, a new required field or a dropped literal is reported, with a detail.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from vllm_layerskip.patches.hook_check import check_source_tree
from vllm_layerskip.patches.hook_table import HOOKS, KINDS, find_hook, needed_files

SITE = Path(importlib.util.find_spec("vllm").origin).parent.parent  # locates, imports nothing
REPO = Path(__file__).resolve().parents[2]


def _copy(root: Path, relpath: str, *edits: tuple[str, str]) -> None:
    """Copy one vLLM file under root, applying (old, new) text edits."""
    text = (SITE / relpath).read_text()
    for old, new in edits:
        assert old in text, f"{relpath} no longer contains {old!r}: update this test"
        text = text.replace(old, new, 1)
    (root / relpath).parent.mkdir(parents=True, exist_ok=True)
    (root / relpath).write_text(text)


def _by_name(results):
    return {(r.hook.name, r.hook.kind, r.hook.names): r for r in results}


def test_installed_vllm_has_every_hook():
    bad = [(r.hook.label, r.status, r.detail) for r in check_source_tree(SITE) if not r.ok]
    assert bad == []


def test_table_matches_the_patches():
    # The patches' own start-up check and the table must agree on signatures.
    hook = find_hook("EngineArgs.create_speculative_config")
    assert hook.exact and hook.params == ("self", "target_model_config", "target_parallel_config")
    assert find_hook("GPUModelRunner.propose_draft_token_ids").params[:3] == (
        "self", "scheduler_output", "sampled_token_ids")
    assert find_hook("_expand_kernel_impl").cpu_only
    assert all(h.module.startswith("vllm/") and h.module.endswith(".py") for h in HOOKS)
    assert {h.kind for h in HOOKS} <= set(KINDS)


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    """A vLLM tree whose edited files break some hooks; results for those files' hooks."""
    root = tmp_path_factory.mktemp("vllm_edited")
    _copy(root, "vllm/engine/arg_utils.py",
          ("        target_parallel_config: ParallelConfig,\n    ) -> SpeculativeConfig",
           "        parallel_config: ParallelConfig,\n    ) -> SpeculativeConfig"))
    _copy(root, "vllm/v1/worker/utils.py",
          ("    def build_metadata_for_drafting(", "    def build_metadata_for_drafting_v2("))
    _copy(root, "vllm/v1/attention/backend.py",
          ("    block_table_tensor: torch.Tensor\n",
           "    block_table_tensor: torch.Tensor\n    draft_depth: int\n"))
    _copy(root, "vllm/config/speculative.py", ('    "custom_class",\n', ""))
    _copy(root, "vllm/v1/worker/cpu_model_runner.py",
          ("    def get_model(self)",
           "    def propose_draft_token_ids(self, *args):\n        pass\n\n    def get_model(self)"))
    _copy(root, "vllm/utils/cpu_triton_utils.py",
          ("def _expand_kernel_impl(", "def _expand_kernel_impl_v2("))
    hooks = tuple(h for h in HOOKS if (root / h.module).is_file())
    return _by_name(check_source_tree(root, hooks=hooks))


@pytest.mark.parametrize("key, status, detail", [
    (("EngineArgs.create_speculative_config", "method", ()), "changed",
     "parameters (self, target_model_config, parallel_config), expected "
     "(self, target_model_config, target_parallel_config)"),
    (("AttentionGroup.build_metadata_for_drafting", "method", ()), "missing",
     "AttentionGroup has no build_metadata_for_drafting"),
    (("SpeculativeConfig.method", "literals", ("custom_class",)), "changed",
     "no longer contains 'custom_class'"),
    (("CPUModelRunner", "not-overridden", ("propose_draft_token_ids",)), "changed",
     "now overrides propose_draft_token_ids"),
    (("_expand_kernel_impl", "function", ()), "missing", "no _expand_kernel_impl"),
])
def test_edited_hooks_are_reported(edited, key, status, detail):
    result = edited[key]
    assert (result.status, detail in result.detail) == (status, True), result.detail


def test_new_required_dataclass_field_is_reported(edited):
    [result] = [r for (name, kind, _), r in edited.items()
                if name == "CommonAttentionMetadata" and kind == "fields"]
    assert result.status == "changed"
    assert "new required field(s) draft_depth" in result.detail


def test_unedited_hooks_in_edited_files_stay_ok(edited):
    assert edited[("AttentionGroup", "attributes", ("layer_names",))].ok
    assert edited[("SpeculativeConfig", "fields", ("method", "model", "num_speculative_tokens"))].ok
    assert edited[("CPUModelRunner.load_model", "mentions", ("self.drafter.load_model",))].ok


@pytest.fixture(scope="module")
def fetched(tmp_path_factory):
    """The files a check reads when it starts from an empty tree, as from a wheel."""
    root = tmp_path_factory.mktemp("vllm_fetched")
    fetched: list[str] = []

    def fetch(relpath):
        fetched.append(relpath)
        if (SITE / relpath).is_file():
            (root / relpath).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(SITE / relpath, root / relpath)

    results = check_source_tree(root, fetch=fetch)
    return fetched, results


def test_missing_files_are_fetched_on_demand(fetched):
    files, results = fetched
    assert all(r.ok for r in results)
    assert set(needed_files()) <= set(files)
    assert len(files) < 60  # a handful of files, not the whole package


def test_script_checks_a_wheel_without_network(tmp_path, capsys, fetched):
    """--wheel: unzip only what is needed from the wheel, print the table, exit 1."""
    spec = importlib.util.spec_from_file_location("check_vllm_hooks", REPO / "scripts/check_vllm_hooks.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    broken = tmp_path / "broken"
    _copy(broken, "vllm/v1/worker/gpu_model_runner.py",
          ("        slot_mappings: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]] | None,\n"
           "    ) -> list[list[int]] | torch.Tensor:",
           "        slot_mappings: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]] | None,\n"
           "        draft_budget: int = 0,\n"
           "    ) -> list[list[int]] | torch.Tensor:"))
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for relpath in fetched[0]:
            if not (SITE / relpath).is_file():
                continue
            source = broken / relpath if (broken / relpath).is_file() else SITE / relpath
            zf.write(source, relpath)
        zf.writestr("vllm/_C.abi3.so", b"\0")  # binary members are never extracted

    assert script.main(["--wheel", str(wheel), "--cache-dir", str(tmp_path / "cache")]) == 1
    out = capsys.readouterr().out
    assert re.search(r"CHANGED +gpu\+cpu +GPUModelRunner\.propose_draft_token_ids", out)
    assert "slot_mappings, draft_budget)" in out
    n = len(HOOKS)
    assert f"vLLM 9.9.9: {n - 1}/{n} hooks ok; 1 required for gpu not ok (changed)" in out
    extracted = tmp_path / "cache" / "src" / wheel.stem
    assert not (extracted / "vllm/_C.abi3.so").exists()

    assert script.main(["--installed"]) == 0


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _from_site(root):
    def fetch(relpath):
        if (SITE / relpath).is_file():
            (root / relpath).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(SITE / relpath, root / relpath)
    return fetch


def test_start_up_report_under_the_escape_hatch(tmp_path):
    """report_hook_points (run by register() when VLLM_LAYERSKIP_ALLOW_ANY_VLLM=1
    lets another vLLM load) warns with each broken hook, and is quiet otherwise."""
    from vllm_layerskip import report_hook_points

    _copy(tmp_path, "vllm/v1/worker/utils.py",
          ("    def build_metadata_for_drafting(", "    def build_metadata_for_drafting_v2("))
    _copy(tmp_path, "vllm/utils/cpu_triton_utils.py",
          ("def _expand_kernel_impl(", "def _expand_kernel_impl_v2("))
    handler = _Lines()
    logger = logging.getLogger("vllm.layerskip")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        gpu = report_hook_points("0.99.0", tmp_path, on_cpu=False, fetch=_from_site(tmp_path))
        cpu = report_hook_points("0.99.0", tmp_path, on_cpu=True, fetch=_from_site(tmp_path))
        clean = report_hook_points("0.99.1", SITE, on_cpu=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert gpu == ["missing v1/worker/utils.py:AttentionGroup.build_metadata_for_drafting "
                   "[method]: AttentionGroup has no build_metadata_for_drafting (base classes searched)"]
    assert len(cpu) == 2 and "utils/cpu_triton_utils.py:_expand_kernel_impl [function]" in cpu[1]
    assert clean == []
    warning, cpu_warning, info = handler.lines
    assert warning.startswith("WARNING vllm-layerskip: vLLM 0.99.0 is not a supported version "
                              "(VLLM_LAYERSKIP_ALLOW_ANY_VLLM=1 let it load), and its source lacks "
                              "or changed 1 of the ")
    assert warning.endswith(gpu[0])
    assert "changed 2 of the" in cpu_warning
    assert info.startswith("INFO vllm-layerskip: vLLM 0.99.1 is not a supported version, but all ")
