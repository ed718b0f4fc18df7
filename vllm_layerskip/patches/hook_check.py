"""Checks the hook table (hook_table.py) against a vLLM source tree, by reading
it: `check_source_tree(root)` parses the sources with `ast` (nothing is
imported, so a GPU wheel can be checked on a CPU machine, and no vLLM is needed
at all) and reports each hook as ok / missing / changed.

The start-up check in `vllm_layerskip.patches` inspects the live, imported
vLLM; this one answers the same question for a release before anyone installs
it (`scripts/check_vllm_hooks.py`), and for an unsupported vLLM that the escape
hatch lets load (the hooks the plugin only reads).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vllm_layerskip.patches.hook_table import HOOKS, Hook
from vllm_layerskip.patches.source_tree import (
    SourceTree,
    module_scope,
    find_toplevel,
    find_class,
    own_members,
    find_member,
    param_names,
    node_strings,
    dataclass_fields,
)


@dataclass(frozen=True)
class HookResult:
    hook: Hook
    status: str  # "ok" | "missing" | "changed"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ---- the check -------------------------------------------------------------------


def check_source_tree(root: Path, fetch: Callable[[str], None] | None = None,
                      hooks: tuple[Hook, ...] = HOOKS) -> list[HookResult]:
    """Check every hook against the vLLM sources under root (root/vllm/...).

    `fetch(relpath)` is called for a file missing under root, so a caller can
    extract files from a wheel only when needed (e.g. a base class's module).
    """
    tree = SourceTree(Path(root), fetch)
    results = []
    for hook in hooks:
        try:
            status, detail = _check(tree, hook)
        except SyntaxError as e:  # a release written in newer Python syntax
            status, detail = "changed", f"cannot parse {e.filename}: {e.msg}"
        results.append(HookResult(hook, status, detail))
    return results


def _check(tree: SourceTree, hook: Hook) -> tuple[str, str]:
    mod = tree.module(hook.module)
    if mod is None:
        return "missing", f"no file {hook.module}"
    if hook.name == "*":
        return _check_node(tree, hook, hook.module, mod)

    head, _, member = hook.name.partition(".")
    if not member:
        if hook.kind in ("class", "fields", "attributes", "not-overridden"):
            found = find_class(tree, hook.module, head)
            if found is None:
                return "missing", f"no class {head} in {hook.module}"
            return _check_node(tree, hook, *found)
        found = find_toplevel(tree, hook.module, head)
        if found is None:
            return "missing", f"no {head} in {hook.module}"
        return _check_node(tree, hook, *found)

    found = find_class(tree, hook.module, head)
    if found is None:
        return "missing", f"no class {head} in {hook.module}"
    cls_path, cls = found
    hit = find_member(tree, cls_path, cls, member)
    if hit is None:
        return "missing", f"{head} has no {member} (base classes searched)"
    owner_path, _, node = hit
    return _check_node(tree, hook, owner_path, node)


def _check_node(tree: SourceTree, hook: Hook, relpath: str, node: ast.AST) -> tuple[str, str]:
    """Check the node the hook names (found in file relpath) against the hook."""
    kind = hook.kind
    if kind in ("function", "method"):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return "changed", f"{hook.name} is no longer a function ({type(node).__name__})"
        return _check_params(hook, *param_names(node))

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
        own = [n for n in hook.names if isinstance(own_members(node).get(n), (ast.FunctionDef, ast.AsyncFunctionDef))]
        if own:
            return "changed", f"{hook.name} now overrides {', '.join(own)}"
        return "ok", ""

    if kind == "fields":
        fields = dataclass_fields(tree, relpath, node)
        lost = [n for n in hook.names if n not in fields]
        if lost:
            return "changed", f"{hook.name} has no field {', '.join(lost)}"
        new_required = [n for n, req in fields.items() if req and n not in hook.names] if hook.exact else []
        if new_required:
            return "changed", f"{hook.name} has new required field(s) {', '.join(new_required)}"
        return "ok", ""

    if kind == "attributes":
        lost = [n for n in hook.names if find_member(tree, relpath, node, n) is None]
        if lost:
            return "changed", f"{hook.name} has no attribute {', '.join(lost)} (base classes searched)"
        return "ok", ""

    if kind == "names":
        scope = module_scope(node) if isinstance(node, ast.Module) else {}
        lost = [n for n in hook.names if n not in scope]
        if lost:
            return "missing", f"{hook.module} no longer defines {', '.join(lost)}"
        return "ok", ""

    if kind == "literals":
        found = node_strings(tree, relpath, node)
        lost = [n for n in hook.names if n not in found]
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
