"""One vLLM engine per configuration, all alive at once, driven in turns.

Why several engines in one process, and what that takes:
- Interleaving: configurations take turns on the same prompts (see
  workloads.schedule), so machine drift (other jobs on the 2 shared cores,
  thermal state) hits all of them alike. Restarting engines per turn would cost
  ~20 s per start; keeping them alive costs memory (~3.3 GB each with a 1 GB KV
  cache: front-end state here, EngineCore ~0.8 GB, Worker ~2.5 GB).
- An idle engine does not slow the others: vLLM's worker spins on its shared-
  memory queue for 1 s after its last step, then sleeps on a socket. Measured
  here: a 32-token request took 2.07 s right after another engine's request and
  2.15 s with the other engines idle (medians of 4), so no settle time is needed
  for vLLM itself; `settle` exists for background optimizer threads (SWIFT's
  Gaussian-process thread may still finish a suggestion after its turn).
- But an engine idle for over a second is slow to start a long prefill (see
  Engine.wake), so every timed call is preceded by a no-op RPC.
- Metrics: vLLM's Prometheus logger registers its counters in the process-wide
  registry and, when the next engine starts, unregisters all of them, so
  `llm.get_metrics()` would read the newest engine's counters for every engine.
  Right after an engine starts we move its collectors into a registry of its
  own and read them from there (the counter objects keep counting).
- Memory: the engine's processes are the children this process gained while
  the engine started; their peak RSS (VmHWM, kernel-tracked, so no sampling gaps)
  is summed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field

import psutil

from .configs import Config


# ---- Intel OpenMP for vLLM's CPU worker --------------------------------------------

IOMP_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         ".venv", "lib", "libiomp5.so")


def with_iomp_preloaded(env: dict) -> dict:
    """`env` with the venv's libiomp5 first in LD_PRELOAD (vLLM's CPU worker is
    faster for spec decoding with Intel OpenMP), unless it is missing or there."""
    preload = env.get("LD_PRELOAD", "")
    if not os.path.isfile(IOMP_PATH) or "libiomp" in preload:
        return env
    return {**env, "LD_PRELOAD": ":".join(filter(None, [IOMP_PATH, preload]))}


def reexec_with_iomp() -> None:
    """Re-exec this script with libiomp5 preloaded: LD_PRELOAD only takes effect at
    process start."""
    env = with_iomp_preloaded(dict(os.environ))
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):
        print(f"re-exec with LD_PRELOAD={env['LD_PRELOAD']}", flush=True)
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


# ---- vLLM counters, read from an engine's own registry -----------------------------

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
HISTOGRAMS = {
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:request_decode_time_seconds": "decode_time",
    "vllm:time_to_first_token_seconds": "ttft",
}


@dataclass
class Counters:
    """vLLM's spec-decode counters and a few latency histograms (sum, count)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    hist: dict[str, tuple[float, int]] = field(default_factory=dict)

    def __sub__(self, other: "Counters") -> "Counters":
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda v: list(v) + [0] * (n - len(v))  # noqa: E731
        return Counters(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            [a - b for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos))],
            {k: (s - other.hist.get(k, (0.0, 0))[0], c - other.hist.get(k, (0.0, 0))[1])
             for k, (s, c) in self.hist.items()},
        )


def claim_vllm_collectors():
    """The vLLM collectors now in the global registry (the newest engine's) in
    a registry of their own."""
    from prometheus_client import REGISTRY, CollectorRegistry

    own = CollectorRegistry(auto_describe=True)
    for collector in list(REGISTRY._collector_to_names):
        if getattr(collector, "_name", "").startswith("vllm:"):
            own.register(collector)
    return own


def read_counters(registry) -> Counters:
    c = Counters()
    per_pos: dict[int, int] = {}
    for metric in registry.collect():
        if metric.name in SPEC_COUNTERS:
            total = sum(s.value for s in metric.samples if s.name.endswith("_total"))
            setattr(c, SPEC_COUNTERS[metric.name], int(total))
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            for s in metric.samples:
                if s.name.endswith("_total"):
                    pos = int(s.labels["position"])
                    per_pos[pos] = per_pos.get(pos, 0) + int(s.value)
        elif metric.name in HISTOGRAMS:
            total = sum(s.value for s in metric.samples if s.name.endswith("_sum"))
            count = sum(s.value for s in metric.samples if s.name.endswith("_count"))
            c.hist[HISTOGRAMS[metric.name]] = (float(total), int(count))
    c.accepted_per_pos = [per_pos.get(i, 0) for i in range(max(per_pos, default=-1) + 1)]
    return c


# ---- proposer stats ------------------------------------------------------------------

def diff_stats(after: dict, before: dict) -> dict:
    """Proposer counters over a turn: numbers are differenced (recursively), other
    values kept as they are at the end of the turn. The cost model's cumulative
    drafting fraction becomes drafting/total step counts of the turn."""
    out = {}
    for key, value in after.items():
        prev = before.get(key)
        if key == "cost_model" and isinstance(value, dict):
            prev = prev or {}
            steps = value.get("steps", 0) - prev.get("steps", 0)

            def drafting_steps(cm):
                return cm.get("drafting_fraction", 0.0) * cm.get("steps", 0)

            def draft_length_sum(cm):
                return drafting_steps(cm) * cm.get("mean_draft_length", 0.0)

            out[key] = {**value, "turn_steps": steps,
                        "turn_drafting_steps": round(drafting_steps(value) - drafting_steps(prev)),
                        "turn_draft_length_sum": round(draft_length_sum(value)
                                                       - draft_length_sum(prev))}
        elif isinstance(value, bool) or not isinstance(value, (int, float, dict)):
            out[key] = value
        elif isinstance(value, dict):
            out[key] = diff_stats(value, prev if isinstance(prev, dict) else {})
        elif isinstance(prev, (int, float)) and not isinstance(prev, bool):
            out[key] = value - prev
        else:
            out[key] = value
    return out


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _vm_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# ---- one engine ----------------------------------------------------------------------

@dataclass
class Turn:
    """What one engine did in one turn (one generate call or a few)."""

    seconds: float
    token_ids: list[list[int]]
    # Engine steps: the longest output of each generate call (batches), the steps
    # that returned output (generate_in_flight).
    steps: int
    counters: Counters
    stats: dict


class Engine:
    def __init__(self, config: Config, model: str, llm_kwargs: dict):
        self.config = config
        self.model = model
        self.llm_kwargs = llm_kwargs
        self.llm = None
        self.registry = None
        self.pids: set[int] = set()
        self.startup_seconds = 0.0
        self.error: str | None = None
        self.requests_added = 0  # request ids of generate_in_flight, unique per engine

    @property
    def name(self) -> str:
        return self.config.name

    def start(self) -> None:
        from vllm import LLM

        before = _descendants()
        t0 = time.perf_counter()
        self.llm = LLM(model=self.model, speculative_config=self.config.spec,
                       disable_log_stats=False, **self.llm_kwargs)
        self.startup_seconds = time.perf_counter() - t0
        self.registry = claim_vllm_collectors()
        # Children that appeared while this engine started: its EngineCore and
        # Worker (and, for the first engine, multiprocessing's resource tracker,
        # which is tiny and shared; it is left out).
        self.pids = {pid for pid in _descendants() - before
                     if "resource_tracker" not in " ".join(_cmdline(pid))}

    def counters(self) -> Counters:
        return read_counters(self.registry)

    def stats(self) -> dict:
        from vllm_layerskip.core import measure

        return measure.proposer_stats(self.llm) if self.config.family == "plugin" else {}

    def generate(self, prompts: list[str], params, batch_size: int | None = None,
                 settle: float = 0.0) -> Turn:
        """Timed generate calls: all prompts at once (the engine batches them),
        or `batch_size` per call. Counters and stats are read after `settle`
        seconds so a background optimizer's trailing work is counted here."""
        before = self.counters(), self.stats()
        size = batch_size or len(prompts)
        token_ids, seconds, steps = [], 0.0, 0
        for i in range(0, len(prompts), size):
            self.wake()
            t0 = time.perf_counter()
            outputs = self.llm.generate(prompts[i:i + size], params, use_tqdm=False)
            seconds += time.perf_counter() - t0
            ids = [list(o.outputs[0].token_ids) for o in outputs]
            token_ids += ids
            steps += max(len(t) for t in ids)
        return self._turn(seconds, token_ids, steps, before, settle)

    def generate_in_flight(self, prompts: list[str], params, in_flight: int,
                           settle: float = 0.0) -> Turn:
        """Timed: `in_flight` requests at a time, the next prompt entering as soon
        as a request finishes (vllm bench serve --max-concurrency), through the
        engine's own add_request/step loop. `steps` counts the engine steps that
        returned output (a step of prefill only, e.g. a long chunked prompt, is
        not counted)."""
        engine = self.llm.llm_engine
        before = self.counters(), self.stats()
        waiting = list(enumerate(prompts))
        ids: dict[str, int] = {}
        token_ids: list[list[int]] = [[] for _ in prompts]
        steps = 0

        def admit() -> None:
            i, prompt = waiting.pop(0)
            self.requests_added += 1
            request_id = f"in-flight-{self.requests_added}"
            engine.add_request(request_id, prompt, params)  # returns vLLM's internal id
            ids[request_id] = i  # outputs carry the id given here

        self.wake()
        t0 = time.perf_counter()
        while waiting and len(ids) < in_flight:
            admit()
        while ids:
            outputs = engine.step()
            steps += bool(outputs)
            for out in outputs:
                if out.finished:
                    token_ids[ids.pop(out.request_id)] = list(out.outputs[0].token_ids)
                    if waiting:
                        admit()
        seconds = time.perf_counter() - t0
        return self._turn(seconds, token_ids, steps, before, settle)

    def _turn(self, seconds: float, token_ids: list[list[int]], steps: int,
              before: tuple[Counters, dict], settle: float) -> Turn:
        """The turn, its counters and stats read `settle` seconds after it ended
        so a background optimizer's trailing work is counted in it."""
        if settle:
            time.sleep(settle)
        counters, stats = before
        return Turn(seconds, token_ids, steps, self.counters() - counters,
                    diff_stats(self.stats(), stats))

    def wake(self) -> None:
        """A no-op RPC right before a timed call. A worker idle for over 1 s
        leaves its busy-polling mode, and the next long prefill then took ~1.2 s
        longer here (760-token prompt: 2.7 s idle vs 1.5-1.6 s awake, medians of
        8); without this, engines whose stats are read by RPC before each turn
        (the plugin's) started awake and the others did not."""
        self.llm.collective_rpc("check_health")

    def memory(self) -> dict:
        """Peak and current RSS of the engine's processes, in MiB."""
        alive = [pid for pid in self.pids if psutil.pid_exists(pid)]
        return {
            "peak_rss_mib": sum(_vm_kb(pid, "VmHWM") for pid in alive) / 1024,
            "rss_mib": sum(_vm_kb(pid, "VmRSS") for pid in alive) / 1024,
            "processes": {pid: " ".join(_cmdline(pid))[:40] for pid in alive},
        }

    def shutdown(self) -> None:
        if self.llm is not None:
            from vllm_layerskip.core import measure

            llm, self.llm = self.llm, None
            measure.shutdown(llm)


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def engines_that_fit(reserve_gib: float, per_engine_gib: float) -> int:
    """How many engines the free memory holds, keeping `reserve_gib` for others."""
    free = psutil.virtual_memory().available / 2**30
    return int((free - reserve_gib) // per_engine_gib)


# ---- one method's engine at a time, paused by RPC (bench_interleaved) --

def add_method_engine_arguments(parser) -> None:
    """The options of a benchmark that starts one method's engine at a time."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--model", default=None, help="a checkpoint directory or hub id, or a name `vllm-layerskip prepare-model` knows (smollm2-135m, qwen2.5-coder-1.5b, ...); default: the prepared Qwen2.5-Coder-1.5B-Instruct")
    parser.add_argument("--method-options", type=json.loads, default={},
                        help='per method, e.g. \'{"swift": {"prompt_lookup_max": 0}}\'')
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compile", action="store_true", help="compiled engines (vLLM's default)")
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--dataset-path", default=None)
    parser.add_argument("--out", default=os.path.join(root, "benchmarks", "results"))


def prepare_method_engine_run(args) -> str:
    """Intel OpenMP (a re-exec), the environment a paused engine needs (its RPCs
    send functions), every core to the worker; returns the model's path."""
    reexec_with_iomp()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm_layerskip.tools.cpu_threads import bind_every_core
    bind_every_core()
    return model_path(args.model)


def model_path(model: str | None) -> str:
    """--model: a checkpoint directory or hub id as vLLM takes it, or the name of
    a model `vllm-layerskip prepare-model` knows (prepared if needed); none: the
    prepared Qwen2.5-Coder-1.5B-Instruct."""
    from vllm_layerskip.tools.prepare_model import CATALOG, ensure_model

    if not model:
        return ensure_model("qwen2.5-coder-1.5b", quiet=True)
    if model in CATALOG:
        return ensure_model(model, quiet=True)
    return model


def start_method_engine(method: str, args, model: str, spec_defaults: dict,
                        family: str = "plugin") -> "Engine":
    """`method`'s engine: K, then `spec_defaults` (e.g. the shipped files), then
    the user's --method-options; started, with a line saying how long it took."""
    spec = {"method": method, "num_speculative_tokens": args.k, **spec_defaults,
            **args.method_options.get(method, {})}
    engine = Engine(Config(method, method, spec, family=family), model,
                    dict(dtype=args.dtype, enforce_eager=not args.compile, max_model_len=2048, seed=0))
    engine.start()
    print(f"{method}: started in {engine.startup_seconds:.0f} s, spec {json.dumps(spec)}", flush=True)
    return engine
