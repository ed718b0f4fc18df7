"""Names in a vLLM source tree, found by reading it with `ast` (nothing is
imported, so a GPU wheel can be read on a CPU machine): modules, their
top-level names and what they import, classes with their members and bases,
a function's parameters, the strings a node holds, a dataclass's fields. What
patches/hook_check.py checks the hook table against.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable, Iterator

class SourceTree:
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


def toplevel(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those under if/try (TYPE_CHECKING etc.)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from toplevel(stmt.body)
            yield from toplevel(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *[h.body for h in stmt.handlers]):
                yield from toplevel(block)
        else:
            yield stmt


def assigned_names(stmt: ast.stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    names = []
    for target in targets:
        for node in ast.walk(target) if target is not None else ():
            if isinstance(node, ast.Name):
                names.append(node.id)
    return names


def module_scope(mod: ast.Module) -> dict[str, ast.AST]:
    """Name -> defining node (def, class, assignment or import) at module level."""
    scope: dict[str, ast.AST] = {}
    for stmt in toplevel(mod.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.setdefault(stmt.name, stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for name in assigned_names(stmt):
                scope.setdefault(name, stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                scope.setdefault((alias.asname or alias.name).split(".")[0], stmt)
    return scope


def imported_name(stmt: ast.ImportFrom, name: str) -> str:
    for alias in stmt.names:
        if (alias.asname or alias.name) == name:
            return alias.name
    return name


def find_toplevel(tree: SourceTree, relpath: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
    """(file, node) defining module-level `name` of relpath; a re-export
    (`from vllm.x import name`) is followed to where it is defined."""
    mod = tree.module(relpath)
    if mod is None or depth > 5:
        return None
    node = module_scope(mod).get(name)
    if isinstance(node, ast.ImportFrom):
        target = tree.resolve_import(relpath, node)
        if target is not None:
            return find_toplevel(tree, target, imported_name(node, name), depth + 1)
    if node is None:  # `from .parallel_state import *` (vllm/distributed/__init__.py)
        for stmt in toplevel(mod.body):
            if isinstance(stmt, ast.ImportFrom) and stmt.names[0].name == "*":
                target = tree.resolve_import(relpath, stmt)
                found = target and find_toplevel(tree, target, name, depth + 1)
                if found:
                    return found
    return None if node is None else (relpath, node)


def find_class(tree: SourceTree, relpath: str, name: str) -> tuple[str, ast.ClassDef] | None:
    found = find_toplevel(tree, relpath, name)
    return found if found is not None and isinstance(found[1], ast.ClassDef) else None  # type: ignore[return-value]


def own_members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """Members a class defines itself: defs, class-level assignments, self.x = ..."""
    members: dict[str, ast.AST] = {}
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.setdefault(stmt.name, stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for name in assigned_names(stmt):
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


def class_bases(tree: SourceTree, relpath: str, cls: ast.ClassDef) -> Iterator[tuple[str, ast.ClassDef]]:
    for base in cls.bases:
        if isinstance(base, ast.Name):
            found = find_class(tree, relpath, base.id)
            if found is not None:
                yield found


def find_member(
    tree: SourceTree, relpath: str, cls: ast.ClassDef, name: str, depth: int = 0
) -> tuple[str, ast.ClassDef, ast.AST] | None:
    """(file, owning class, node) of cls.name, searching base classes depth-first."""
    node = own_members(cls).get(name)
    if node is not None:
        return relpath, cls, node
    if depth > 8:
        return None
    for base_path, base in class_bases(tree, relpath, cls):
        found = find_member(tree, base_path, base, name, depth + 1)
        if found is not None:
            return found
    return None


def param_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str]]:
    """(all parameter names in inspect.signature order, positional-only names)."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return names, [p.arg for p in a.posonlyargs]


def node_strings(tree: SourceTree, relpath: str, node: ast.AST) -> set[str]:
    """String constants in node, following names of module-level constants/aliases
    (e.g. `method: SpeculativeMethod | None` -> `SpeculativeMethod = Literal[...]`)."""
    mod = tree.module(relpath)
    scope = module_scope(mod) if mod is not None else {}
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


def dataclass_fields(tree: SourceTree, relpath: str, cls: ast.ClassDef, depth: int = 0) -> dict[str, bool]:
    """Annotated class-level fields (base classes included) -> whether the
    constructor requires them."""
    fields: dict[str, bool] = {}
    if depth < 8:
        for base_path, base in class_bases(tree, relpath, cls):
            fields.update(dataclass_fields(tree, base_path, base, depth + 1))
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
