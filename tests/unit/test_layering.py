"""The package imports only downward, read from the source (nothing is imported):

    vllm_layerskip/__init__.py (the plugin entry)
      tools/      commands: prepare-model, demo, the CLI
      patches/    what vLLM's code calls
      methods/    one folder per method, and the registry
      core/       what every method shares
      kernels     (the top-level kernels/ folder, installed as vllm_layerskip.kernels)

A module may import from its own layer or one below; a method's folder imports
no other method's folder (the registry finds them by name); and no group of
modules imports itself in a circle, at module level or inside functions."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "vllm_layerskip"
LAYERS = {"kernels": 0, "core": 1, "methods": 2, "patches": 3, "tools": 4, "": 5}


def module_name(path: Path) -> str:
    if path.is_relative_to(REPO / "kernels"):
        parts = ("vllm_layerskip", "kernels", *path.relative_to(REPO / "kernels").with_suffix("").parts)
    else:
        parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def all_modules() -> dict[str, Path]:
    files = [*PACKAGE.rglob("*.py"), *(REPO / "kernels").rglob("*.py")]
    return {module_name(p): p for p in files}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The plugin's modules this file imports (`from pkg import mod` counts as mod)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in modules:
                found.add(name)
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 and parts[1] in LAYERS else ""]


def method_folder(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "methods" and parts[2] != "registry":
        return parts[2]
    return None


def test_every_import_goes_down_or_stays_in_its_layer():
    modules = all_modules()
    upward, across = [], []
    for name, path in modules.items():
        for target in imports_of(path, modules):
            if layer(target) > layer(name):
                upward.append(f"{name} -> {target}")
            mine, theirs = method_folder(name), method_folder(target)
            if mine and theirs and mine != theirs:
                across.append(f"{name} -> {target}")
    assert upward == [] and across == []


def test_no_import_circles():
    modules = all_modules()
    graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
    # A package's __init__ is imported with each of its modules: an edge to it
    # from inside the package is not a circle of its own.
    graph = {n: {t for t in targets if not n.startswith(t + ".")} for n, targets in graph.items()}
    circles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert circles == []
