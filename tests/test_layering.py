"""How the project's packages import each other (issues #18, #42).

- **No import cycles**, counting every import statement wherever it is: at module level, under ``try``/``if``, and
  inside functions (a lazy import, e.g. of Triton, still makes the two modules depend on each other).
- **Layers**: a package imports only packages of lower layers (:data:`LAYERS`); ``minite_util`` (the shared
  helpers: file I/O, "did you mean") imports nothing of the project, ``minite_kernels`` nothing but ``minite_util``.
- **Public seams** (the rule for ``rollout/``): ``rollout`` imports from ``minite_kernels`` only

  - names in ``minite_kernels.__all__``, as ``from minite_kernels import NAME`` (the package's lazy exports:
    importing it is cheap and imports no torch), and
  - names in ``minite_kernels.backends.triton.__all__``, as ``from minite_kernels.backends.triton import NAME``
    (the Triton kernels the graph sampler launches itself; importing that package imports Triton, so these
    imports sit inside functions or a ``try``), or that package itself (``import minite_kernels.backends.triton``);

  never a module below them (``minite_kernels.modules.fast_lane``, ``backends/triton/norm_quant``, ...), nor a
  private attribute such as a module's weight cache entries (``WeightCache`` has a public API for that).
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("minite_util", "minite_kernels", "triage", "trainers", "rollout", "eval", "scoring")
#: package -> layer: a package may import packages of lower layers only
LAYERS = {"minite_util": 0, "minite_kernels": 1, "triage": 2, "scoring": 2, "rollout": 3, "eval": 4, "trainers": 5}
#: the packages whose ``__all__`` is ``rollout``'s whole view of ``minite_kernels``
SEAMS = ("minite_kernels", "minite_kernels.backends.triton")


def _modules(root: pathlib.Path = ROOT, packages=PACKAGES) -> dict[str, pathlib.Path]:
    mods = {}
    for pkg in packages:
        for f in (root / pkg).rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
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


def import_graph(root: pathlib.Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports, from every import statement in its file (functions included)."""
    mods = _modules(root, packages)
    graph = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
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


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_a_function_level_import_makes_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import g\n    return g\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_packages_import_only_lower_layers():
    upward = sorted(
        (name, dep)
        for name, deps in import_graph().items()
        for dep in deps
        if LAYERS[dep.split(".")[0]] >= LAYERS[name.split(".")[0]] and dep.split(".")[0] != name.split(".")[0]
    )
    assert upward == []
    assert set(LAYERS) == set(PACKAGES)


def test_minite_util_imports_only_the_standard_library():
    """The lowest layer: every package may import it, so it imports nothing of the project nor a third party."""
    imported = set().union(*(_all_imports(f) for f in (ROOT / "minite_util").rglob("*.py")))
    outside = sorted(n for n in imported if n.split(".")[0] not in sys.stdlib_module_names | {"minite_util"})
    assert outside == []


def _package_init(package: str) -> pathlib.Path:
    return ROOT.joinpath(*package.split(".")) / "__init__.py"


def _exports(package: str) -> set[str]:
    """``__all__`` of ``package``'s ``__init__`` (a literal list), read without importing it."""
    for node in ast.parse(_package_init(package).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{package} has no __all__")


def _defined(package: str) -> set[str]:
    """The names ``package``'s ``__init__`` provides: bound at module level by imports, assignments and
    definitions, plus the keys of its ``_LAZY`` table (names imported on first use)."""
    names: set[str] = set()
    for node in ast.parse(_package_init(package).read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(getattr(t, "id", None) == "_LAZY" for t in targets):
                names |= set(ast.literal_eval(node.value))
    return names


def test_the_seams_export_only_names_they_provide():
    for package in SEAMS:
        exports = _exports(package)
        assert exports and exports <= _defined(package), (package, sorted(exports - _defined(package)))


def seam_violations() -> dict[str, list[str]]:
    """``rollout`` file -> the imports of ``minite_kernels`` in it (anywhere in the file) that break the rule of the
    module docstring."""
    exports = {package: _exports(package) for package in SEAMS}
    out: dict[str, list[str]] = {}
    for f in sorted((ROOT / "rollout").rglob("*.py")):
        bad = []
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                bad += [
                    a.name
                    for a in node.names
                    if a.name.split(".")[0] == "minite_kernels" and a.name not in SEAMS
                ]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module.split(".")[0] != "minite_kernels":
                    continue
                allowed = exports.get(node.module, set())
                bad += [f"{node.module}.{a.name}" for a in node.names if a.name not in allowed]
        if bad:
            out[str(f.relative_to(ROOT))] = bad
    return out


def test_rollout_imports_minite_kernels_only_through_its_public_seams():
    assert seam_violations() == {}
    # the scan sees imports inside functions (rollout/packed.py imports the Triton kernels only where it uses them)
    assert "minite_kernels.backends.triton" in _all_imports(ROOT / "rollout" / "packed.py")


def test_rollout_reads_no_private_weight_cache_state():
    """The sampler reaches the modules' quantized weights through ``WeightCache``'s public API only."""
    offenders = {
        str(f.relative_to(ROOT))
        for f in (ROOT / "rollout").rglob("*.py")
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in ("_entries", "_token", "_weight_cache")
        or isinstance(node, ast.Constant)
        and node.value in ("_entries", "_token", "_weight_cache")
    }
    assert offenders == set()


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
