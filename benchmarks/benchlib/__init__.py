"""Pieces of benchmarks/bench_methods.py (and bench_serve.py).

configs   which speculative configurations run, and which cannot run here (why)
engines   one vLLM engine per configuration, kept alive for the whole run; its
          own counters, proposer stats and peak memory
workloads Spec-Bench prompts per category, latency and concurrent workloads,
          the interleaved schedule
figures   per-category aggregates and derived figures (speedup, M, alpha, c, E)
          and the projection for memory-bound hardware
report    markdown, CSV, JSON and PNG output
long_prompts
          the project's own long prompts (code to edit, documents to answer
          from) at a token count, for bench_serve.py --prompt-tokens
"""
