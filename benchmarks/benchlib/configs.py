"""Which speculative configurations a run compares.

A Config is one engine: plain decoding, one of vLLM's own methods, or one of the
plugin's. What cannot run on this machine (a missing dependency, a plugin method
that has not landed yet, a GPU-only method) becomes a Config with `skip_reason`
set: it starts no engine and appears in the report as "skipped: <why>", so a
reader sees what was left out instead of a silently shorter table.
"""

from __future__ import annotations

import dataclasses
import itertools

import json
import os
from dataclasses import dataclass, field

from vllm_layerskip.core.measure import DRAFTING_PAUSED_ENV  # stdlib only: no vLLM at --help

PLUGIN_METHODS = ("layer_skip", "quantized", "swift", "clasp", "self_sd", "adadecode")
# vLLM's own methods that need no trained draft (model, heads or EAGLE layers).
NATIVE_METHODS = ("ngram", "suffix", "ngram_gpu")
# vLLM's methods that draft with a second, smaller model of the target's vocabulary
# (--draft-model; by default Qwen2.5-Coder-0.5B-Instruct, for Qwen2.5-Coder-1.5B).
DRAFT_MODEL_METHODS = ("draft_model",)
# What --methods accepts. swift_initial: layer_skip with SWIFT's starting set,
# to see what SWIFT's optimizer adds on top of it. clasp_uniform / self_sd_uniform:
# layer_skip with an evenly spread set of the same size as CLaSp's (whole layers)
# or the shipped Self-SD profile's (sub-layers), to see what choosing the set adds.
# plain_control: a second plain engine, an A/A control: its "speedup" over plain
# shows how far two identical engines drift apart on this machine.
MATCHED_UNIFORM = ("swift_initial", "clasp_uniform", "self_sd_uniform")
METHODS = ("plain", "plain_control", *NATIVE_METHODS, *DRAFT_MODEL_METHODS, "layer_skip",
           "quantized", "swift_initial", "swift", "clasp", "clasp_uniform", "self_sd", "self_sd_uniform",
           "adadecode")
# ngram_gpu is vLLM's GPU-tensor ngram: on a CPU it fails at start-up (it
# allocates pinned memory), so it runs only when asked for. draft_model too: it
# needs a second model prepared (and ~1.5 GiB more memory for the 0.5B in bf16).
DEFAULT_METHODS = tuple(m for m in METHODS if m not in ("ngram_gpu", "swift_initial",
                                                        *DRAFT_MODEL_METHODS))
# --draft-length: (speculative-config keys, label suffix) of each mode.
DRAFT_LENGTH_MODES = {"adaptive": ({}, ""), "fixed": ({"adaptive_draft_length": False}, ", fixed K"),
                      "paused": ({}, ", drafting paused")}
# The draft_model's draft unless --draft-model says otherwise: a prepare-model name.
DEFAULT_DRAFT_MODEL = "qwen2.5-coder-0.5b"
# The options that run a method with the file the plugin ships for the model.
SHIPPED_FILE_OPTIONS = {"self_sd": {"profile": "shipped"}, "adadecode": {"heads": "shipped"}}


@dataclass
class Config:
    name: str  # row label in every table and plot
    method: str  # "plain" or a speculative method
    spec: dict | None = None  # vLLM speculative_config (None: plain decoding)
    skip_reason: str | None = None  # set: cannot run here, no engine
    # "plain" | "control" (a second plain engine) | "vllm" | "vllm_model" (vLLM's, drafting
    # with a second model: no "no model forward" projection) | "plugin"
    family: str = "plugin"
    extra: dict = field(default_factory=dict)  # e.g. the skip set, for the projection
    env: dict = field(default_factory=dict)  # set in its engine's (server's) environment

    @property
    def runs(self) -> bool:
        return self.skip_reason is None


def build_configs(args, model_path: str) -> list[Config]:
    """Configurations in table order, plain first (every speedup is over it)."""
    k = args.k
    wanted = list(dict.fromkeys(args.methods))
    overrides = args.method_options or {}
    configs = [Config("plain", "plain", None, family="plain")]
    if "plain_control" in wanted:
        configs.append(Config("plain (A/A control)", "plain", None, family="control"))

    def spec_for(method: str, base: dict) -> dict:
        return {**base, **overrides.get(method, {})}

    if "ngram" in wanted:
        configs.append(Config("ngram", "ngram", spec_for("ngram", {
            "method": "ngram", "num_speculative_tokens": k,
            "prompt_lookup_max": 4, "prompt_lookup_min": 2}), family="vllm"))
    if "suffix" in wanted:
        configs.append(Config("suffix", "suffix", spec_for("suffix", {
            "method": "suffix", "num_speculative_tokens": k}),
            skip_reason=suffix_skip_reason(), family="vllm"))
    if "ngram_gpu" in wanted:
        configs.append(Config("ngram_gpu", "ngram_gpu", spec_for("ngram_gpu", {
            "method": "ngram_gpu", "num_speculative_tokens": k,
            "prompt_lookup_max": 4, "prompt_lookup_min": 2}),
            skip_reason=gpu_only_skip_reason("ngram_gpu"), family="vllm"))
    if "draft_model" in wanted:
        draft = getattr(args, "draft_model", None) or default_draft_model_path()
        configs.append(Config("draft_model " + os.path.basename(os.path.normpath(draft)),
                              "draft_model", spec_for("draft_model", {
                                  "method": "draft_model", "model": draft,
                                  "num_speculative_tokens": k}),
                              skip_reason=draft_model_skip_reason(model_path, draft),
                              family="vllm_model"))

    available = plugin_methods_available()
    num_layers = model_num_layers(model_path)
    for mode in args.draft_length:
        # adaptive: the plugin's default (the cost model picks each step's draft
        # length, 0 = no draft); fixed: K drafted every step; paused (servers
        # only): the method's engine with drafting paused from the start, the
        # plugin loaded but drafting nothing (core/measure.py DRAFTING_PAUSED_ENV).
        extra, suffix = DRAFT_LENGTH_MODES[mode]
        first = len(configs)
        for method in METHODS:
            if method not in wanted or method not in PLUGIN_METHODS + MATCHED_UNIFORM:
                continue
            base_method = "layer_skip" if method in MATCHED_UNIFORM else method
            reason = None if base_method in available else (
                f"method '{base_method}' is not in this plugin version "
                f"(vllm_layerskip.methods.registry.METHOD_NAMES = {list(available)})")
            base = {"method": base_method, "num_speculative_tokens": k, **extra}
            if method == "layer_skip" and getattr(args, "identity_layers", None):
                # The identity-padded model (padded_model.py): skip exactly the
                # inserted layers, a draft that is the base model itself.
                layers = args.identity_layers
                configs.append(Config(f"layer_skip, identity layers skipped{suffix}", method,
                                      spec_for(method, {**base, "skip_layers": layers}), reason,
                                      extra={"skip_sets": {"skip_attn": layers, "skip_mlp": layers}}))
            elif method == "layer_skip" and getattr(args, "layer_skip_sets", None):
                for sets in args.layer_skip_sets:  # explicit sets, e.g. {"skip_mlp": [...]}
                    label = "layer_skip " + " ".join(f"{k.removeprefix('skip_')} {v}"
                                                     for k, v in sets.items())
                    full = {"skip_attn": sorted(set(sets.get("skip_attn", [])) | set(sets.get("skip_layers", []))),
                            "skip_mlp": sorted(set(sets.get("skip_mlp", [])) | set(sets.get("skip_layers", [])))}
                    configs.append(Config(label + suffix, method, spec_for(method, {**base, **sets}),
                                          reason, extra={"skip_sets": full}))
            elif method == "layer_skip":
                for r in args.ratios:
                    label = f"layer_skip r={r:g}" + (" (no skip)" if r == 0 else "")
                    spec = spec_for(method, {**base, "sublayer_skip_ratio": r} if r else base)
                    configs.append(Config(label + suffix, method, spec, reason,
                                          extra={"skip_sets": uniform_sets(num_layers, r)}))
            elif method == "swift_initial":
                ratio = args.swift_ratio or default_swift_ratio()
                sets = swift_initial_sets(num_layers, ratio)
                configs.append(Config(f"layer_skip swift's initial set r={ratio:g}{suffix}",
                                      "layer_skip", spec_for("layer_skip", {**base, **sets}), reason,
                                      extra={"skip_sets": sets}))
            elif method == "clasp_uniform":
                sets = clasp_uniform_sets(num_layers, args.clasp_ratio, overrides.get("clasp", {}))
                configs.append(Config(f"layer_skip {len(sets['skip_attn'])} layers evenly spread"
                                      f" (clasp's size){suffix}", "layer_skip",
                                      spec_for("layer_skip", {**base, **sets}), reason,
                                      extra={"skip_sets": sets}))
            elif method == "self_sd_uniform":
                sets = self_sd_uniform_sets(model_path)
                size = len(sets["skip_attn"]) + len(sets["skip_mlp"])
                configs.append(Config(f"layer_skip {size} sub-layers evenly spread"
                                      f" (self_sd's size){suffix}", "layer_skip",
                                      spec_for("layer_skip", {**base, **sets}), reason,
                                      extra={"skip_sets": sets}))
            elif method == "quantized":  # every layer through int4 copies (its default)
                configs.append(Config(method + suffix, method, spec_for(method, base), reason,
                                      extra={"skip_sets": {"skip_attn": [], "skip_mlp": []}}))
            elif method == "swift":  # the plugin's default r unless --swift-ratio
                opts = {"skip_ratio": args.swift_ratio} if args.swift_ratio else {}
                label = f"swift r={args.swift_ratio:g}" if args.swift_ratio else "swift"
                configs.append(Config(label + suffix, method, spec_for(method, {**base, **opts}), reason))
            elif method == "clasp":
                opts = {"layer_skip_ratio": args.clasp_ratio} if args.clasp_ratio else {}
                label = f"clasp r={args.clasp_ratio:g}" if args.clasp_ratio else "clasp"
                configs.append(Config(label + suffix, method, spec_for(method, {**base, **opts}), reason))
            elif method == "self_sd":  # the skip profile shipped with the plugin
                configs.append(Config(method + suffix, method,
                                      spec_for(method, {**base, **SHIPPED_FILE_OPTIONS[method]}), reason))
            else:  # adadecode: the exit heads shipped with the plugin
                configs.append(Config(method + suffix, method,
                                      spec_for(method, {**base, **SHIPPED_FILE_OPTIONS[method]}), reason))
        if mode == "paused":
            for config in configs[first:]:
                config.env = {DRAFTING_PAUSED_ENV: "1"}
    configs = [plain for plain in configs if plain.family != "plugin"] + with_variants(
        [c for c in configs if c.family == "plugin"], args)
    configs = with_draft_lengths(configs, getattr(args, "method_k", None) or {})
    for config in configs:  # a K set per method (--method-options, --method-k) is named
        own_k = (config.spec or {}).get("num_speculative_tokens", k)
        if own_k != k:
            config.name += f", K={own_k}"
    return configs


def with_draft_lengths(configs: list[Config], method_k: dict[str, list[int]]) -> list[Config]:
    """Each configuration of a method in --method-k once per K given for it (in
    that order), so a peer's best K is searched in the same run as the rest."""
    out = []
    for config in configs:
        for k in method_k.get(config.method, []) if config.spec else []:
            out.append(dataclasses.replace(config, spec={**config.spec, "num_speculative_tokens": k},
                                           extra=dict(config.extra)))
        if not config.spec or config.method not in method_k:
            out.append(config)
    return out


def parse_method_k(text: str) -> tuple[str, list[int]]:
    """'draft_model=2,3,4' -> ('draft_model', [2, 3, 4]); ValueError saying what is
    expected for anything else."""
    method, _, ks = text.partition("=")
    try:
        lengths = [int(k) for k in ks.split(",")]
    except ValueError:
        lengths = []
    if method not in METHODS or not lengths or min(lengths) < 1:
        raise ValueError(f"--method-k {text!r}: expected METHOD=K[,K...] with METHOD one of "
                         f"{', '.join(METHODS[2:])} and each K a positive integer, "
                         "e.g. draft_model=2,3,4")
    return method, lengths


def with_variants(configs: list[Config], args) -> list[Config]:
    """Each plugin configuration once per --draft-vocab-size, per
    --prompt-lookup setting, per --draft-weights and, where its draft weights are
    int4, per --draft-weights-grid (rows in that order, the plugin's default first)."""
    out = []
    for config in configs:
        for size, lookup, weights in itertools.product(
                getattr(args, "draft_vocab_sizes", None) or [None],
                getattr(args, "prompt_lookup", None) or ["default"],
                getattr(args, "draft_weights", None) or ["default"]):
            int4 = weights == "int4" or (weights == "default" and config.method == "quantized"
                                         and config.spec.get("draft_weights", "int4") == "int4")
            for grid in (getattr(args, "draft_weights_grid", None) or [None]) if int4 else [None]:
                spec, label = dict(config.spec), config.name
                if size is not None:
                    spec["draft_vocab_size"] = size
                    label += ", full vocabulary" if size == 0 else f", draft vocabulary {size}"
                if lookup == "on":
                    spec.update(prompt_lookup_max=4, prompt_lookup_min=2)
                    label += ", +lookup"
                elif lookup == "off":
                    spec.update(prompt_lookup_max=0)
                    label += ", no lookup"
                elif lookup == "suffix_tree":
                    spec.update(copy_source="suffix_tree")
                    label += ", suffix-tree copies"
                elif lookup != "default":
                    high, low = lookup_bounds(lookup)
                    spec.update(prompt_lookup_max=high, prompt_lookup_min=low)
                    label += f", lookup {high}..{low}"
                if weights != "default":
                    spec["draft_weights"] = weights
                    label += f", {weights} draft weights"
                if grid is not None:
                    spec["draft_weights_grid"] = grid
                    label += f", {grid} grid"
                out.append(dataclasses.replace(config, name=label, spec=spec,
                                               extra=dict(config.extra)))
    return out


def lookup_bounds(setting: str) -> tuple[int, int]:
    """(prompt_lookup_max, prompt_lookup_min) of a --prompt-lookup 'MAX..MIN'
    setting; ValueError, saying what is expected, for anything else."""
    high, sep, low = setting.partition("..")
    if sep and high.isdigit() and low.isdigit() and 1 <= int(low) <= int(high):
        return int(high), int(low)
    raise ValueError(f"{setting!r}: expected default, on, off or MAX..MIN with "
                     "1 <= MIN <= MAX (e.g. 4..4)")


def plugin_methods_available() -> tuple[str, ...]:
    from vllm_layerskip.methods.registry import METHOD_NAMES

    return METHOD_NAMES


def suffix_skip_reason() -> str | None:
    """vLLM's suffix decoding imports Snowflake's arctic_inference.suffix_decoding;
    the full package also registers a vLLM plugin, which would patch every engine
    of the run (plain's and the plugin's too)."""
    if not has_arctic_inference():
        return ("needs arctic-inference's suffix tree (arctic_inference.suffix_decoding), "
                "not installed: `bash scripts/install_suffix.sh` builds it on this CPU from "
                "the 0.3.0 source package (C++ only, without the package's vLLM plugin)")
    plugins = arctic_plugin_entry_points()
    if plugins:
        return (f"the installed arctic-inference registers a vLLM plugin ({', '.join(plugins)}) "
                "that patches vLLM in every engine of the run, plain's included: reinstall it "
                "with `bash scripts/install_suffix.sh` (the suffix tree alone, no plugin)")
    return None


def has_arctic_inference() -> bool:
    from vllm.utils.import_utils import has_arctic_inference as has

    return has()


def arctic_plugin_entry_points() -> list[str]:
    """The vllm.general_plugins entry points arctic-inference declares."""
    from importlib.metadata import entry_points

    return sorted(f"{e.name} = {e.value}" for e in entry_points(group="vllm.general_plugins")
                  if e.value.startswith("arctic_inference")
                  or (e.dist is not None and e.dist.name.replace("_", "-") == "arctic-inference"))


def default_draft_model_path() -> str:
    """Where `vllm-layerskip prepare-model qwen2.5-coder-0.5b` puts the default
    draft (nothing is prepared here: a missing draft is a skip reason)."""
    from vllm_layerskip.tools.prepare_model import cache_root, known_model

    return os.path.join(cache_root(), known_model(DEFAULT_DRAFT_MODEL).directory)


def draft_model_skip_reason(target_path: str, draft_path: str) -> str | None:
    """Why vLLM's draft_model cannot run with this draft for this target: the
    draft is missing, or its vocabulary is not the target's (vLLM verifies the
    draft's token ids with the target's tokenizer)."""
    if not os.path.isfile(os.path.join(draft_path, "config.json")):
        how = (f"prepare it with `vllm-layerskip prepare-model {DEFAULT_DRAFT_MODEL}` (or "
               "`LAYERSKIP_PEERS=1 bash scripts/install.sh`)"
               if draft_path == default_draft_model_path() else "check --draft-model")
        return f"no draft model at {draft_path}: {how}"
    target_vocab = model_config(target_path).get("vocab_size")
    draft_vocab = model_config(draft_path).get("vocab_size")
    if target_vocab != draft_vocab:
        return (f"the draft {os.path.basename(os.path.normpath(draft_path))} has a vocabulary "
                f"of {draft_vocab} tokens, the target {target_vocab}: vLLM's draft_model needs "
                "the target's vocabulary (the default draft is for Qwen2.5-Coder-1.5B)")
    target_tokens, draft_tokens = tokenizer_vocab(target_path), tokenizer_vocab(draft_path)
    if target_tokens is not None and draft_tokens is not None and target_tokens != draft_tokens:
        differ = sorted(set(target_tokens.items()) ^ set(draft_tokens.items()))[:3]
        return (f"the draft's tokenizer maps tokens to other ids than the target's (e.g. "
                f"{differ}): vLLM's draft_model needs the target's vocabulary")
    return None


def tokenizer_vocab(model_path: str) -> dict | None:
    """token -> id of a checkpoint's tokenizer.json (its added tokens included),
    or None without one."""
    path = os.path.join(model_path, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        tok = json.load(f)
    vocab = dict((tok.get("model") or {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in tok.get("added_tokens", [])})
    return vocab


def gpu_only_skip_reason(method: str) -> str | None:
    import torch

    if torch.cuda.is_available():
        return None
    return (f"vLLM's '{method}' needs a GPU: on this CPU its engine fails at start-up "
            "('pin_memory=True requires a CUDA or other accelerator backend')")


def model_num_layers(model_path: str) -> int:
    return model_config(model_path)["num_hidden_layers"]


def model_config(model_path: str) -> dict:
    with open(os.path.join(model_path, "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg)


def uniform_sets(num_layers: int, ratio: float) -> dict:
    """The sub-layers layer_skip's sublayer_skip_ratio skips (core.skip_mask.uniform_skip_sets)."""
    from vllm_layerskip.core.skip_mask import uniform_skip_sets

    attn, mlp = uniform_skip_sets(num_layers, ratio) if ratio else (set(), set())
    return {"skip_attn": sorted(attn), "skip_mlp": sorted(mlp)}


def default_swift_ratio() -> float:
    from vllm_layerskip.methods.swift.options import SwiftOptions

    return SwiftOptions().skip_ratio


def swift_initial_sets(num_layers: int, ratio: float) -> dict:
    """The evenly spread set SWIFT starts from, as layer_skip options."""
    from vllm_layerskip.core.skip_set_optimizer import SubLayerSpace
    from vllm_layerskip.methods.swift.options import SwiftOptions

    space = SubLayerSpace(num_layers)
    count = SwiftOptions(skip_ratio=ratio).num_skipped(num_layers)
    return space.layer_sets(space.evenly_spread(count))


def clasp_uniform_sets(num_layers: int, ratio: float | None, clasp_options: dict) -> dict:
    """Whole layers, as many as CLaSp skips with these options, evenly spread the
    way CLaSp's own starting set is."""
    from vllm_layerskip.methods.clasp.options import ClaspOptions
    from vllm_layerskip.methods.clasp.dp_scheduler import evenly_spread_layers

    keys = {k: v for k, v in clasp_options.items()
            if k in ("num_skip_layers", "layer_skip_ratio", "skip_ratio")}
    if ratio and not keys.keys() & {"num_skip_layers", "layer_skip_ratio", "skip_ratio"}:
        keys["layer_skip_ratio"] = ratio
    layers = sorted(evenly_spread_layers(num_layers, ClaspOptions(**keys).num_skipped(num_layers)))
    return {"skip_attn": layers, "skip_mlp": layers}


def self_sd_uniform_sets(model_path: str) -> dict:
    """As many sub-layers as the shipped Self-SD profile skips, spread evenly the
    way the search's seed set is (whole layers first)."""
    from vllm_layerskip.core.identity import checkpoint_identity
    from vllm_layerskip.core.skip_set_optimizer import SubLayerSpace
    from vllm_layerskip.methods.self_sd.profile import load_profile

    cfg = model_config(model_path)
    profile = load_profile("shipped", checkpoint_identity(model_path))
    space = SubLayerSpace(cfg["num_hidden_layers"])
    return space.layer_sets(space.evenly_spread(profile.num_skipped))


def engine_groups(configs: list[Config], max_alive: int) -> list[list[Config]]:
    """Configurations per group of engines alive at once, plain first in each:
    with more configurations than fit in memory, groups run one after the other
    and every speedup is against the plain engine of its own group. The A/A
    control, when asked for, runs in every group, after plain: each group's
    noise floor is its own (start_engines names both by their group). Where
    only two engines fit (a 1.5B model in bf16 here: ~7 GiB each), the control
    runs in a group of its own, first: plain beside a second plain engine."""
    plain, others = configs[0], configs[1:]
    controls = [c for c in others if c.family == "control"]
    others = [c for c in others if c.family != "control"]
    if controls and max_alive - 1 - len(controls) < 1:
        alone = [[plain, control] for control in controls]
        return alone + [[plain, c] for c in others]
    per_group = max(1, max_alive - 1 - len(controls))
    chunks = [others[i:i + per_group] for i in range(0, len(others), per_group)] or [[]]
    return [[plain, *controls, *chunk] for chunk in chunks]


def sequential_groups(configs: list[Config]) -> list[list[Config]]:
    """One engine alive at a time (`--sequential`, for engines of which two do not
    fit: the 1.5B model in float32 is ~11.4 GiB): every configuration in a group
    of its own, plain first, the A/A control last so that it measures the
    machine's drift over the whole run. The caller pairs every turn with the first
    group's plain engine."""
    return [[c] for c in sorted(configs, key=lambda c: c.family == "control")]
