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
from typing import Callable, Iterator

from vllm_layerskip.patches.hook_table import HOOKS, Hook


@dataclass(frozen=True)
class HookResult:
    hook: Hook
    status: str  # "ok" | "missing" | "changed"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


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
