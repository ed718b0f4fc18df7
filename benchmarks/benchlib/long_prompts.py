"""Long prompts of a given length, built from this repository's own text, for
`vllm bench serve --dataset-name custom` (bench_serve.py --prompt-tokens).

Two kinds, alternating:

- code to edit: source files of the vllm_layerskip/ package, concatenated (each
  under a `# file: PATH` line) and cut at a line to length, after an instruction
  ("Add type hints and docstrings to this code", "Find the bug ...", ...);
- a document to answer from: docs/*.md and docs/methods/*.md concatenated and
  cut at a word to length, with a question at the end.

Prompt i of a set starts at a different file (offset `start + i`), so the
prompts of a set differ from their first line; `tags` put a distinct line first
in every prompt (bench_serve.py: one per round, level and prompt) so that no
request reuses another's prompt from vLLM's prefix cache. The length is the
prompt text's, before the chat template, counted with the tokenizer given
(`count_tokens`); it lands within a few percent of the target.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]

CODE_INSTRUCTIONS = (
    "Add type hints and docstrings to this code. Return the whole code.",
    "Find the bug in this code, explain it in two sentences and give the fixed function.",
    "Refactor this code for readability without changing what it does. Return the whole code.",
    "Write pytest unit tests for the functions in this code.",
)
DOC_QUESTIONS = (
    "Summarize the documentation above in five bullet points.",
    "Which command-line options does the documentation above mention, and what does each do?",
    "According to the documentation above, what are the limits of the approach it describes?",
    "What would a new user have to run first, according to the documentation above?",
)
KINDS = ("code", "docs")


def code_files(root: Path = ROOT) -> list[tuple[str, str]]:
    """(path, text) of the package's Python files with some content, sorted."""
    files = []
    for path in sorted((root / "vllm_layerskip").rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) >= 400:
            files.append((str(path.relative_to(root)), text))
    return files


def doc_files(root: Path = ROOT) -> list[tuple[str, str]]:
    """(path, text) of docs/*.md and docs/methods/*.md, sorted."""
    paths = sorted((root / "docs").glob("*.md")) + sorted((root / "docs" / "methods").glob("*.md"))
    return [(str(p.relative_to(root)), p.read_text(encoding="utf-8", errors="replace"))
            for p in paths]


def _material(files: list[tuple[str, str]], first: int, kind: str, chars: int) -> str:
    """At least `chars` characters of the files from file `first` on (cycling)."""
    parts, size, i = [], 0, 0
    while size < chars and i < 4 * len(files) + 1:
        path, text = files[(first + i) % len(files)]
        part = f"# file: {path}\n{text}" if kind == "code" else text
        parts.append(part.rstrip("\n") + "\n\n")
        size += len(parts[-1])
        i += 1
    return "".join(parts)


def _cut(text: str, chars: int, kind: str) -> str:
    """`text` cut to about `chars` characters, at a line (code) or a word (docs)."""
    if chars >= len(text):
        return text.rstrip()
    head = text[:chars]
    at = head.rfind("\n") if kind == "code" else max(head.rfind(" "), head.rfind("\n"))
    if at > chars // 2:
        head = head[:at]
    return head.rstrip()


def _wrap(kind: str, body: str, i: int, tag: str) -> str:
    if kind == "code":
        instruction = CODE_INSTRUCTIONS[(i // 2) % len(CODE_INSTRUCTIONS)]
        return f"{tag}{instruction}\n\n```python\n{body}\n```"
    question = DOC_QUESTIONS[(i // 2) % len(DOC_QUESTIONS)]
    return (f"{tag}Read the documentation below, then answer the question at its end.\n\n"
            f"{body}\n\nQuestion: {question}")


def build_prompt(count_tokens: Callable[[str], int], target: int, i: int, start: int = 0,
                 tag: str = "", files: dict | None = None) -> dict:
    """Prompt i (kind KINDS[i % 2]) of about `target` tokens, as
    {"prompt", "kind", "prompt_tokens"}: the material's length is found by
    scaling a character count by target/measured until it lands within 2%
    (at most 8 measurements; the closest below 1.1x target is kept)."""
    files = files or {"code": code_files(), "docs": doc_files()}
    kind = KINDS[i % 2]
    material = _material(files[kind], start + i // 2, kind, 6 * target + 2000)
    chars = 3 * target  # a first guess: ~3-4 characters a token for code and English
    best = None
    for _ in range(8):
        prompt = _wrap(kind, _cut(material, chars, kind), i, tag)
        n = count_tokens(prompt)
        if best is None or (abs(n - target) < abs(best[1] - target) and n <= 1.1 * target):
            best = (prompt, n)
        if abs(n - target) <= 0.02 * target:
            break
        chars = max(16, int(chars * target / max(n, 1)))
        if chars >= len(material):  # all material used: grow it
            material = _material(files[kind], start + i // 2, kind, 2 * chars)
    prompt, n = best
    return {"prompt": prompt, "kind": kind, "prompt_tokens": n}


def build_prompts(count_tokens: Callable[[str], int], target: int, n: int, start: int = 0,
                  tags: list[str] | None = None) -> list[dict]:
    """`n` prompts of about `target` tokens, alternating code and docs."""
    files = {"code": code_files(), "docs": doc_files()}
    return [build_prompt(count_tokens, target, i, start, tags[i] if tags else "", files)
            for i in range(n)]


def write_jsonl(path: str, prompts: list[dict], output_tokens: int) -> str:
    """The prompts as vLLM's custom dataset reads them: one {"prompt": ...,
    "output_tokens": ...} a line (extra fields, kind and prompt_tokens, are
    ignored by vLLM)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p["prompt"], "output_tokens": output_tokens,
                                "kind": p["kind"], "prompt_tokens": p["prompt_tokens"]}) + "\n")
    return path


def token_counter(model: str) -> Callable[[str], int]:
    """Counts tokens with the model's tokenizer: its tokenizer.json through the
    `tokenizers` library where the model is a directory that has one (fast to
    load), else transformers' AutoTokenizer. Special tokens are not counted."""
    path = os.path.join(model, "tokenizer.json")
    if os.path.isfile(path):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(model)
    return lambda text: len(auto(text, add_special_tokens=False)["input_ids"])
