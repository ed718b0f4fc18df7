"""Two, then three, plain engines of the same model taking turns, 8 requests in
flight: each turn's wall time and the CPU seconds of every process (this one,
the turn's engine, the idle ones), and each engine's memory in huge pages.

Why two identical engines decode at different speeds on a machine: if the
turn's worker works longer while the others stay idle, the machine's memory is
slower at that time or place, not the engines (benchmarks/RESULTS.md, the Xeon VM,
2026-11-29; bench_memory_bandwidth.py measures the memory itself). Environment:
TOK (tokens a request, default 48), COMPILE (1: compiled engines, default).
Three 1.5B bf16 engines never run at once: A stops before C starts.

    .venv/bin/python benchmarks/engine_turns_probe.py
    THP_MEM_ALLOC_ENABLE=1 .venv/bin/python benchmarks/engine_turns_probe.py   # huge pages for weights
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
from benchlib.engines import reexec_with_iomp  # noqa: E402
from vllm_layerskip.tools.cpu_threads import bind_every_core  # noqa: E402

bind_every_core(os.environ)
import psutil
from benchlib.configs import Config
from benchlib.engines import Engine
from vllm import SamplingParams
from vllm_layerskip.core.measure import chat_prompts, interleave_categories, read_questions
from vllm_layerskip.tools.prompts import benchmark_dataset

MODEL = os.environ.get("MODEL") or os.path.expanduser("~/.cache/vllm_layerskip/Qwen2.5-Coder-1.5B-Instruct")
TOK = int(os.environ.get("TOK", 48))
COMPILE = os.environ.get("COMPILE", "1") == "1"
MAINP = psutil.Process()

def cpu(pids):
    out = {}
    for p in pids:
        try:
            t = psutil.Process(p).cpu_times(); out[p] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out

def smaps(pid):
    try:
        d = {}
        for line in open(f"/proc/{pid}/smaps_rollup"):
            k, v = line.split(":", 1)
            if k in ("Rss", "AnonHugePages", "Anonymous", "FilePmdMapped", "Shared_Clean", "Private_Clean"):
                d[k] = int(v.split()[0]) // 1024
        return d
    except OSError:
        return {}

def start(name):
    e = Engine(Config(name=name, method="plain", family="plain"), MODEL,
               dict(dtype="bfloat16", enforce_eager=not COMPILE, max_model_len=2048, seed=0))
    t = time.time(); e.start(); print(f"{name} started {time.time()-t:.0f}s pids {sorted(e.pids)}", flush=True)
    for p in sorted(e.pids):
        pr = psutil.Process(p)
        print(f"   pid {p} {' '.join(pr.cmdline())[:30]!r} threads={pr.num_threads()} aff={pr.cpu_affinity()} {smaps(p)}", flush=True)
    return e

def main():
    engines = [start("A"), start("B")]
    qs = read_questions(benchmark_dataset(None))
    prompts = chat_prompts(engines[0].llm, interleave_categories(qs)[:8])
    params = SamplingParams(temperature=0, max_tokens=TOK, ignore_eos=True)
    for e in engines:
        e.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))

    def turn(e, others):
        allp = [MAINP.pid] + sorted(e.pids) + [p for o in others for p in sorted(o.pids)]
        c0 = cpu(allp); t0 = time.perf_counter()
        tr = e.generate_in_flight(prompts, params, 8)
        wall = time.perf_counter() - t0; c1 = cpu(allp)
        d = {p: round(c1.get(p, 0) - c0.get(p, 0), 1) for p in allp}
        own = {p: d[p] for p in sorted(e.pids)}
        oth = {p: d[p] for o in others for p in sorted(o.pids)}
        print(f"{e.name}: wall {wall:.1f}s steps {tr.steps} main {d[MAINP.pid]} own {own} others {oth}", flush=True)
        return wall

    res = {"A": [], "B": []}
    for r in range(3):
        order = engines if r % 2 == 0 else engines[::-1]
        for e in order:
            res[e.name].append(turn(e, [o for o in engines if o is not e]))
    print("pair:", {k: [round(x, 1) for x in v] for k, v in res.items()}, flush=True)
    for e in engines:
        for p in sorted(e.pids): print(f"   {e.name} pid {p} {smaps(p)}")
    # A gone: B alone
    engines[0].shutdown(); time.sleep(3)
    for _ in range(2): res["B"].append(turn(engines[1], []))
    # C started after A is gone, B alive
    engines = [engines[1], start("C")]
    engines[1].generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))
    res["C"] = []
    for r in range(2):
        order = engines if r % 2 == 0 else engines[::-1]
        for e in order:
            res[e.name].append(turn(e, [o for o in engines if o is not e]))
    print("all:", {k: [round(x, 1) for x in v] for k, v in res.items()}, flush=True)
    for e in engines: e.shutdown()

if __name__ == '__main__':
    reexec_with_iomp()
    main()
