#!/usr/bin/env python3
"""Serving under load: a real `vllm serve` process per method, 64 concurrent
streaming requests, 10% of them cancelled mid-stream by the client.

For plain decoding and then each layer-skip method, the script starts
`vllm serve` on 127.0.0.1 (a free port; float32, eager), sends every request at
once to /v1/chat/completions with streaming and `return_token_ids`, and checks:

- every request that was not cancelled completes (a finish_reason, no error);
- greedy requests return the same token ids (and text) as the plain server's;
- malformed requests (bad JSON, negative max_tokens, unknown model, no
  messages) get vLLM's normal 4xx answer;
- afterwards the server is healthy and answers one more request, and the
  proposer holds no state of earlier requests: its status file
  (VLLM_LAYERSKIP_STATUS_FILE, written after every step) shows, at the last
  step of that lone request, one request in the batch and none tracked
  outside it.

Requests: Spec-Bench first turns of mixed lengths, plus a few prompts that end
a few tokens short of max_model_len (their generations hit it); half greedy,
half sampled (temperature / top-p). The same requests, and the same ones
cancelled (after 2-4 streamed chunks), go to every server. Sampled requests
carry no `seed`: in vLLM 0.32 on CPU a seeded request whose sampled token is
discarded (a chunked prefill) kills the engine, plugin or not ("CPU Generator
does not use offset", GPUModelRunner._bookkeeping_sync).

    benchmarks/load_test.py                  # all methods, 64 requests (~12 min here)
    benchmarks/load_test.py --quick          # 16 requests, for trying
    benchmarks/load_test.py --methods layer_skip,clasp

Writes benchmarks/results/load_<date>[_quick].md and .json; exits 1 if a check
failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout

from vllm_layerskip.tools.prompts import benchmark_dataset  # noqa: E402
from vllm_layerskip.methods.registry import METHOD_NAMES  # noqa: E402

VLLM = Path(sys.executable).parent / "vllm"
RESULTS = REPO / "benchmarks" / "results"

# Every method as the README shows it; K = 4 throughout.
SPECS = {
    "layer_skip": {"method": "layer_skip", "sublayer_skip_ratio": 0.3},
    "quantized": {"method": "quantized"},
    "swift": {"method": "swift"},
    "clasp": {"method": "clasp"},
    "self_sd": {"method": "self_sd", "profile": "shipped"},
    "adadecode": {"method": "adadecode", "heads": "shipped"},
}
NUM_SPECULATIVE_TOKENS = 4
# Prompts this many tokens short of max_model_len: generations hit the limit.
LONG_PROMPT_MARGINS = (40, 12, 4)
MAX_REGULAR_PROMPT_TOKENS = 900


# ---- the workload ----------------------------------------------------------------


@dataclass
class Request:
    index: int
    kind: str  # Spec-Bench category, or "long"
    messages: list[dict]
    prompt_tokens: int  # by the model's chat template
    temperature: float
    top_p: float
    cancel_after_chunks: int | None  # None: read to the end

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def chat_length(tokenizer, text: str) -> int:
    messages = [{"role": "user", "content": text}]
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=True)["input_ids"])


def fit_text(tokenizer, text: str, max_tokens: int) -> str:
    """The longest prefix of text whose chat prompt has at most max_tokens tokens."""
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if chat_length(tokenizer, text[:mid]) <= max_tokens:
            low = mid
        else:
            high = mid - 1
    return text[:low]


def build_workload(model: str, num_requests: int, num_long: int, cancel_fraction: float,
                   max_model_len: int, seed: int) -> list[Request]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rng = np.random.default_rng(seed)
    questions = [json.loads(line) for line in Path(benchmark_dataset()).read_text().splitlines()
                 if line.strip()]
    texts = [(q["category"], q["turns"][0]) for q in questions]
    lengths = [chat_length(tokenizer, t) for _, t in texts]

    long_source = " ".join(t for (c, t) in texts if c == "summarization")
    prompts = []
    for margin in LONG_PROMPT_MARGINS[:num_long]:
        text = fit_text(tokenizer, long_source[margin * 7:], max_model_len - margin)
        prompts.append(("long", text, chat_length(tokenizer, text)))
    regular = [i for i, n in enumerate(lengths) if n <= MAX_REGULAR_PROMPT_TOKENS]
    for i in rng.choice(regular, num_requests - len(prompts), replace=False):
        prompts.append((texts[i][0], texts[i][1], lengths[i]))
    order = rng.permutation(len(prompts))  # long prompts spread among the others
    prompts = [prompts[i] for i in order]

    # Cancelled: regular prompts only (a long one has a few tokens to stream).
    cancellable = [i for i, p in enumerate(prompts) if p[0] != "long"]
    num_cancel = round(cancel_fraction * num_requests)
    cancelled = set(rng.choice(cancellable, num_cancel, replace=False).tolist())
    requests = []
    for i, (kind, text, n) in enumerate(prompts):
        greedy = i % 2 == 0
        requests.append(Request(
            index=i, kind=kind, messages=[{"role": "user", "content": text}], prompt_tokens=n,
            temperature=0.0 if greedy else float(rng.choice([0.7, 1.0])),
            top_p=1.0 if greedy else float(rng.choice([0.9, 1.0])),
            cancel_after_chunks=2 + i % 3 if i in cancelled else None,
        ))
    return requests


# ---- one request -------------------------------------------------------------------


@dataclass
class Outcome:
    index: int
    status: str = "ok"  # ok | cancelled | error
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int | None = None  # as the server counted them
    ttft_s: float | None = None
    latency_s: float | None = None  # to the last token
    error: str = ""


async def stream_request(client: httpx.AsyncClient, model: str, request: Request,
                         max_tokens: int) -> Outcome:
    body = {
        "model": model, "messages": request.messages, "max_tokens": max_tokens,
        "temperature": request.temperature, "top_p": request.top_p,
        "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
    }
    out = Outcome(request.index)
    start = time.perf_counter()
    chunks = 0
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                out.status = "error"
                out.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return out
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    out.prompt_tokens = chunk["usage"]["prompt_tokens"]
                for choice in chunk.get("choices") or []:
                    ids = choice.get("token_ids") or []
                    if ids:
                        now = time.perf_counter() - start
                        out.ttft_s = now if out.ttft_s is None else out.ttft_s
                        out.latency_s = now
                        out.token_ids.extend(ids)
                        chunks += 1
                    out.text += (choice.get("delta") or {}).get("content") or ""
                    out.finish_reason = choice.get("finish_reason") or out.finish_reason
                if request.cancel_after_chunks is not None and chunks >= request.cancel_after_chunks \
                        and out.finish_reason is None:
                    out.status = "cancelled"
                    return out  # leaving the block closes the connection: vLLM aborts
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        out.status, out.error = "error", repr(e)
        return out
    if out.finish_reason is None:
        out.status, out.error = "error", "stream ended without a finish_reason"
    return out


async def run_load(base: str, model: str, requests: list[Request], max_tokens: int):
    limits = httpx.Limits(max_connections=len(requests) + 8)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(stream_request(client, model, r, max_tokens)
                                          for r in requests))
        return list(outcomes), time.perf_counter() - start


# ---- the server ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str, spec: dict | None, args, workdir: Path, name: str):
        from vllm_layerskip.core.proposer_stats import STATUS_FILE_ENV  # imports vLLM: not at --help

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"{name}.log"
        self.status_path = workdir / f"{name}.status.json"
        command = [str(VLLM), "serve", model, "--host", "127.0.0.1", "--port", str(self.port),
                   "--dtype", "float32", "--enforce-eager", "--max-model-len",
                   str(args.max_model_len), "--seed", "0"]
        if spec is not None:
            command += ["--speculative-config", json.dumps(spec)]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
               STATUS_FILE_ENV: str(self.status_path)}
        env.pop("VLLM_PLUGINS", None)
        self.log = open(self.log_path, "w")
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_healthy(self, timeout: float = 300) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n"
                                   f"{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.base + "/health", timeout=5).status_code == 200:
                    return time.perf_counter() - self.start
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vllm serve not healthy after {timeout:.0f} s")

    def metric(self, name: str) -> float:
        text = httpx.get(self.base + "/metrics", timeout=10).text
        values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        return sum(float(v) for v in values)

    def wait_idle(self, timeout: float = 60) -> bool:
        """Cancelled streams are aborted once the server notices the closed
        connection; wait until nothing runs or waits."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.metric("vllm:num_requests_running") + self.metric("vllm:num_requests_waiting") == 0:
                return True
            time.sleep(0.5)
        return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def malformed_requests(base: str, model: str) -> dict[str, int]:
    """HTTP status of each malformed chat request (vLLM answers them 4xx)."""
    message = [{"role": "user", "content": "Hi"}]
    bodies = {
        "bad JSON": b'{"model": "m", "messages": [{"role": ',
        "negative max_tokens": {"model": model, "messages": message, "max_tokens": -1},
        "unknown model": {"model": "no-such-model", "messages": message, "max_tokens": 4},
        "no messages": {"model": model, "max_tokens": 4},
    }
    statuses = {}
    for name, body in bodies.items():
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = httpx.post(base + "/v1/chat/completions", content=content, timeout=30,
                              headers={"Content-Type": "application/json"})
        statuses[name] = response.status_code
    return statuses


def probe(base: str, model: str) -> tuple[int, str | None]:
    """One more greedy request, alone on the server: (HTTP status, finish_reason)."""
    body = {"model": model, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "Name three colours."}]}
    response = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    if response.status_code != 200:
        return response.status_code, None
    return 200, response.json()["choices"][0]["finish_reason"]


# ---- one server's run ------------------------------------------------------------------


def percentile(values, q):
    return float(np.percentile(values, q)) if values else None


def serve_and_load(name: str, spec: dict | None, model: str, requests: list[Request], args,
                   workdir: Path) -> dict:
    print(f"\n== {name}: starting vllm serve", flush=True)
    server = Server(model, spec, args, workdir, name)
    row: dict = {"name": name, "spec": spec, "log": str(server.log_path)}
    try:
        row["startup_s"] = server.wait_healthy()
        print(f"   healthy after {row['startup_s']:.0f} s; {len(requests)} requests", flush=True)
        outcomes, row["wall_s"] = asyncio.run(run_load(server.base, model, requests, args.max_tokens))
        row["idle_after_load"] = server.wait_idle()
        row["malformed_statuses"] = malformed_requests(server.base, model)
        probe_start = time.time()
        row["health_after"] = httpx.get(server.base + "/health", timeout=10).status_code
        row["probe"] = probe(server.base, model)
        row["spec_decode"] = {
            key: server.metric(f"vllm:spec_decode_num_{key}_total")
            for key in ("drafts", "draft_tokens", "accepted_tokens")
        }
        row["proposer_after"] = read_status(server.status_path, probe_start) if spec else None
        # Read before shutdown, which logs the engine's forced exit as errors.
        log = server.log_path.read_text(errors="replace")
    except Exception as e:  # noqa: BLE001 - report it, go on with the next method
        row["failure"] = f"{type(e).__name__}: {e}"
        cause = fatal_line(server.log_path.read_text(errors="replace"))
        if cause:
            row["failure"] += f" (server log: {cause})"
        print(f"   FAILED: {row['failure'][:2000]}", flush=True)
        return row
    finally:
        server.stop()
    row["log_tracebacks"] = log.count("Traceback")
    row["log_errors"] = sum(" ERROR " in line for line in log.splitlines())
    row["outcomes"] = [asdict(o) for o in outcomes]
    return row


def fatal_line(log: str) -> str | None:
    """The server log's first line that says why the engine died."""
    match = re.search(r"^(Fatal glibc error.*|corrupted .*|.*died unexpectedly.*|\w*Error: .*)$",
                      log, re.M)
    return match.group(1).strip()[:300] if match else None


def read_status(path: Path, since: float) -> dict | None:
    """The proposer's status written at the probe's last step (None: no write since)."""
    if not path.is_file():
        return None
    status = json.loads(path.read_text())
    return status if status.get("written_at", 0) >= since else None


# ---- checks and the summary ----------------------------------------------------------------


def summarize(row: dict, requests: list[Request], reference: dict | None, max_model_len: int) -> dict:
    if "failure" in row:
        return {"name": row["name"], "ok": False, "problems": [row["failure"].splitlines()[0][:300]]}
    outcomes = [row["outcomes"][r.index] for r in requests]
    done = [o for o in outcomes if o["status"] == "ok"]
    problems = []
    errors = [o for o in outcomes if o["status"] == "error"]
    if errors:
        problems.append(f"{len(errors)} request errors, e.g. {errors[0]['error'][:200]}")
    for r, o in zip(requests, outcomes):
        # A long prompt's generation ends at max_model_len (or at EOS before it).
        total = (o["prompt_tokens"] or 0) + len(o["token_ids"])
        if r.kind == "long" and o["status"] == "ok" and (
                total > max_model_len or o["finish_reason"] == "length" and total != max_model_len):
            problems.append(f"long request {r.index}: {o['prompt_tokens']} + {len(o['token_ids'])} "
                            f"tokens ({o['finish_reason']}), max_model_len {max_model_len}")

    parity = None
    if reference is not None:
        compared = same = 0
        for r, o in zip(requests, outcomes):
            ref = reference["outcomes"][r.index]
            if not (r.greedy and o["status"] == "ok" and ref["status"] == "ok"):
                continue
            compared += 1
            if o["token_ids"] == ref["token_ids"] and o["text"] == ref["text"]:
                same += 1
            elif len(problems) < 8:
                first = next((i for i, (a, b) in enumerate(zip(o["token_ids"], ref["token_ids"]))
                              if a != b), min(len(o["token_ids"]), len(ref["token_ids"])))
                problems.append(f"greedy request {r.index} differs from plain at token {first}")
        parity = {"greedy_compared": compared, "greedy_identical": same}
        if compared == 0 or same != compared:
            problems.append(f"greedy parity {same}/{compared}")

    bad_malformed = {k: v for k, v in row["malformed_statuses"].items() if not 400 <= v < 500}
    if bad_malformed:
        problems.append(f"malformed requests not answered 4xx: {bad_malformed}")
    if row["health_after"] != 200 or row["probe"][0] != 200 or row["probe"][1] is None:
        problems.append(f"after the run: health {row['health_after']}, probe {row['probe']}")
    if not row["idle_after_load"]:
        problems.append("requests still running 60 s after the load ended")
    if row["log_tracebacks"]:
        problems.append(f"{row['log_tracebacks']} tracebacks in the server log")

    bookkeeping = drafting = None
    if row["spec"] is not None:
        status = row["proposer_after"]
        if status is None:
            problems.append("no proposer status written during the probe request")
        else:
            bookkeeping = status["requests"]
            if bookkeeping["in_batch"] != 1 or bookkeeping["tracked"] > 1 or \
                    bookkeeping["tracked_outside_batch"]:
                problems.append(f"proposer bookkeeping after the run: {bookkeeping}")
            # vLLM may verify fewer draft tokens than were proposed (a token budget
            # cuts drafts short), never more: more means it verified tokens the
            # proposer never drafted (vLLM's zero drafts near max_model_len).
            proposed, verified = status["num_draft_tokens"], row["spec_decode"]["draft_tokens"]
            drafting = {"proposed": proposed, "verified": int(verified)}
            if verified > proposed:
                problems.append(f"vLLM verified {verified:.0f} draft tokens, the proposer "
                                f"drafted {proposed}")
            if status.get("cost_model"):
                drafting["drafting_fraction"] = status["cost_model"]["drafting_fraction"]
            clasp = status.get("clasp")
            if clasp and clasp["dp_runs"]:
                drafting["dp"] = {k: clasp[k] for k in ("dp_runs", "dp_seconds_per_run")}

    latencies = [o["latency_s"] for o in done if o["latency_s"] is not None]
    ttfts = [o["ttft_s"] for o in outcomes if o["ttft_s"] is not None]
    tokens = sum(len(o["token_ids"]) for o in outcomes)
    spec_decode = row["spec_decode"]
    return {
        "name": row["name"], "ok": not problems, "problems": problems,
        "requests": len(requests), "completed": len(done),
        "cancelled": sum(o["status"] == "cancelled" for o in outcomes),
        "errors": len(errors),
        "finish_reasons": {k: sum(o["finish_reason"] == k for o in done)
                           for k in sorted({o["finish_reason"] for o in done})},
        "parity": parity,
        "latency_p50_s": percentile(latencies, 50), "latency_p99_s": percentile(latencies, 99),
        "ttft_p50_s": percentile(ttfts, 50), "wall_s": row["wall_s"],
        "output_tokens_per_s": tokens / row["wall_s"],
        "acceptance": (spec_decode["accepted_tokens"] / spec_decode["draft_tokens"]
                       if spec_decode["draft_tokens"] else None),
        "malformed_statuses": row["malformed_statuses"],
        "health_after": row["health_after"], "probe_after": list(row["probe"]),
        "bookkeeping_after": bookkeeping, "drafting": drafting, "startup_s": row["startup_s"],
        "log_errors": row["log_errors"],
    }


def fmt(value, spec=".2f", none="-"):
    return none if value is None else format(value, spec)


def markdown(summaries: list[dict], meta: dict) -> str:
    lines = [
        f"# Serving under load ({meta['date']})", "",
        f"`{meta['command']}`", "",
        f"{meta['model_name']}, float32, eager, max_model_len {meta['max_model_len']}, "
        f"K = {NUM_SPECULATIVE_TOKENS}, {meta['requests']} concurrent streaming chat requests "
        f"(max_tokens {meta['max_tokens']}; {meta['long']} prompts ending "
        f"{'/'.join(map(str, LONG_PROMPT_MARGINS[:meta['long']]))} tokens before max_model_len; "
        f"half greedy, half sampled; {meta['cancel']} cancelled by the client after 2-4 chunks), "
        f"{meta['machine']}. Latency: request sent to last token, completed requests.", "",
        "| server | completed | cancelled | errors | greedy = plain | p50 latency s | p99 latency s "
        "| TTFT p50 s | out tok/s | acceptance | draft tokens proposed/verified | drafting steps "
        "| proposer after: batch/tracked/outside (max tracked) | 4xx checks | health + probe after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    dp_notes: list[str] = []
    for s in summaries:
        if "completed" not in s:
            lines.append(f"| {s['name']} | failed: {s['problems'][0]} | | | | | | | | | | | | | |")
            continue
        parity = s["parity"]
        parity_text = (f"{parity['greedy_identical']}/{parity['greedy_compared']}"
                       if parity else "(reference)")
        b = s["bookkeeping_after"]
        book = (f"{b['in_batch']}/{b['tracked']}/{b['tracked_outside_batch']} ({b['max_tracked']})"
                if b else "-")
        d = s.get("drafting") or {}
        drafted = f"{d['proposed']}/{d['verified']}" if d else "-"
        drafting_steps = fmt(d.get("drafting_fraction"), ".0%")
        if d.get("dp"):
            dp_notes.append(f"{s['name']}: {d['dp']['dp_runs']} DP runs, "
                            f"{d['dp']['dp_seconds_per_run']:.2f} s per run")
        malformed = s["malformed_statuses"]
        ok_4xx = sum(400 <= v < 500 for v in malformed.values())
        lines.append(
            f"| {s['name']} | {s['completed']}/{s['requests']} | {s['cancelled']} | {s['errors']} "
            f"| {parity_text} | {fmt(s['latency_p50_s'])} | {fmt(s['latency_p99_s'])} "
            f"| {fmt(s['ttft_p50_s'])} | {fmt(s['output_tokens_per_s'], '.1f')} "
            f"| {fmt(s['acceptance'])} | {drafted} | {drafting_steps} | {book} | {ok_4xx}/{len(malformed)} "
            f"| {s['health_after']}, {s['probe_after'][1]} |")
    if dp_notes:
        lines += ["", "CLaSp DP: " + "; ".join(dp_notes)]
    lines += ["", "4xx statuses: " + "; ".join(
        f"{s['name']}: " + ", ".join(f"{k} {v}" for k, v in s["malformed_statuses"].items())
        for s in summaries[:1] if "malformed_statuses" in s)]
    failed = [s for s in summaries if not s["ok"]]
    lines += ["", "All checks passed." if not failed else "Problems:"]
    for s in failed:
        lines += [f"- {s['name']}: {p}" for p in s["problems"]]
    for s in meta.get("skipped", []):
        lines.append(f"- skipped {s}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="default: SmolLM2-135M-Instruct (converted locally)")
    parser.add_argument("--methods", default=",".join(SPECS),
                        help="comma-separated; plain decoding always runs first")
    parser.add_argument("--options", type=json.loads, default={},
                        help='JSON of extra speculative-config keys per server name, e.g. '
                        '\'{"clasp": {"max_dp_requests": 4}}\'; a name that is not a method '
                        'names its method: \'{"clasp_m8": {"method": "clasp", '
                        '"num_skip_layers": 8}}\' with --methods ...,clasp_m8')
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="16 requests, 1 long prompt")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--cancel-fraction", type=float, default=0.1)
    parser.add_argument("--kv-cache-gib", type=float, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output path without suffix "
                        "(default benchmarks/results/load_<date>[_quick])")
    args = parser.parse_args(argv)
    num_requests = 16 if args.quick else args.requests
    num_long = 1 if args.quick else len(LONG_PROMPT_MARGINS)

    if args.model is None:
        from vllm_layerskip.tools.prepare_model import ensure_default_model

        args.model = ensure_default_model(quiet=True)
    methods, skipped = [], []
    specs = {}
    for name in filter(None, args.methods.split(",")):
        extra = args.options.get(name, {})
        method = extra.get("method", name)
        if method not in SPECS:
            parser.error(f"unknown method {method!r}; known: {', '.join(SPECS)}")
        if method not in METHOD_NAMES:
            skipped.append(f"{name}: {method} not in vllm_layerskip.methods.registry.METHOD_NAMES")
            print(f"skipping {name}: this checkout does not provide {method} yet", flush=True)
            continue
        methods.append(name)
        specs[name] = {**SPECS[method], "num_speculative_tokens": NUM_SPECULATIVE_TOKENS, **extra}

    requests = build_workload(args.model, num_requests, num_long, args.cancel_fraction,
                              args.max_model_len, args.seed)
    print(f"{len(requests)} requests: prompt tokens {min(r.prompt_tokens for r in requests)}-"
          f"{max(r.prompt_tokens for r in requests)}, {sum(r.greedy for r in requests)} greedy, "
          f"{sum(r.cancel_after_chunks is not None for r in requests)} to cancel", flush=True)

    started = time.perf_counter()
    rows, summaries = [], []
    workdir = Path(tempfile.mkdtemp(prefix="layerskip-load-"))  # server logs, kept
    print(f"server logs in {workdir}", flush=True)
    reference = None
    for name in ["plain", *methods]:
        spec = specs.get(name)
        row = serve_and_load(name, spec, args.model, requests, args, workdir)
        summary = summarize(row, requests, reference if name != "plain" else None,
                            args.max_model_len)
        if name == "plain" and "failure" not in row:
            reference = row
        if "failure" in row:
            row["log_tail"] = Path(row["log"]).read_text(errors="replace")[-4000:]
        rows.append(row)
        summaries.append(summary)
        print(f"   {'ok' if summary['ok'] else 'PROBLEMS'}: " + json.dumps(
            {k: summary.get(k) for k in ("completed", "cancelled", "errors", "parity",
                                         "latency_p50_s", "latency_p99_s", "ttft_p50_s",
                                         "bookkeeping_after", "problems")}), flush=True)

    date = time.strftime("%Y-%m-%d")
    out = args.out or RESULTS / f"load_{date}{'_quick' if args.quick else ''}"
    meta = {
        "date": date, "command": "python " + " ".join([
            "benchmarks/load_test.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": args.model, "model_name": Path(args.model).name,
        "max_model_len": args.max_model_len, "max_tokens": args.max_tokens,
        "requests": len(requests), "long": num_long,
        "cancel": sum(r.cancel_after_chunks is not None for r in requests),
        "machine": f"{os.cpu_count()} CPU cores", "total_s": time.perf_counter() - started,
        "skipped": skipped,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(
        {"meta": meta, "summaries": summaries, "requests": [asdict(r) for r in requests],
         "servers": rows}, indent=1, default=str))
    text = markdown(summaries, meta)
    Path(f"{out}.md").write_text(text)
    print("\n" + text + f"\nwrote {out}.md / .json in {meta['total_s']:.0f} s total")
    return 0 if all(s["ok"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
