"""The project's packages import each other without module-level cycles (issue #18): a module can be read,
and imported, after the modules it names. Function-level imports (lazy, e.g. of Triton) are not counted."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("minite_kernels", "triage", "trainers", "rollout", "eval", "scoring")


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _imported(name: str, path: pathlib.Path, node: ast.AST, mods: dict) -> set[str]:
    """The project modules one import statement loads (``from pkg import sub`` counts ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in mods}
    if node.level:
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods}
    names_only = any(f"{mod}.{a.name}" not in mods for a in node.names)
    return subs | ({mod} if names_only and mod in mods else set())


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for top in ast.parse(path.read_text()).body:
            for node in ast.walk(top) if isinstance(top, (ast.Try, ast.If)) else (top,):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    deps |= _imported(name, path, node, mods)
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_relative_and_package_imports():
    g = import_graph()
    assert "minite_kernels.backends.triton.nvfp4_jit" in g["minite_kernels.backends.triton.quantize_kernels"]
    assert "minite_kernels.modules.fast_lane" in g["minite_kernels.modules.functional"]


def test_no_module_level_import_cycles():
    assert cycles(import_graph()) == []


def _all_imports(path: pathlib.Path) -> set[str]:
    """Every module an import statement anywhere in ``path`` names, function-level imports included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_modules_reach_the_kernels_only_through_the_backend_interface():
    """``minite_kernels/modules`` names no concrete backend's package: the Triton, TE and FlashInfer code is
    reached through ``Backend`` methods, so a module works with whatever backend the factory gives it."""
    concrete = tuple(f"minite_kernels.backends.{b}" for b in ("triton", "te", "flashinfer"))
    offenders = {
        f.name: sorted(n for n in _all_imports(f) if n.startswith(concrete))
        for f in (ROOT / "minite_kernels" / "modules").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    # the scan sees imports inside functions (rollout/packed.py imports the fast lane only where it uses it)
    assert "minite_kernels.modules.fast_lane" in _all_imports(ROOT / "rollout" / "packed.py")
