"""The package's layers: every import (module-level or inside a function) points to its own layer or one below.

`python tests/test_layers.py` prints the import graph between the package's parts, each under its layer, and
any edge that points up. ARCHITECTURE.md describes the same layers.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("moespac", "baselines")

# bottom to top; a module belongs to the layer of its longest matching prefix
LAYERS = [
    ("foundation", ["moespac.errors", "moespac.pinning", "moespac.iopaths", "moespac.atomic", "moespac.hashing",
                    "moespac.environment", "moespac.fetch", "moespac.record", "moespac.reference", "moespac.prompts",
                    "moespac.datasets", "moespac.routing", "moespac.models", "moespac.configargs",
                    "moespac.parallel"]),
    ("interface", ["moespac.policy", "moespac.cache", "moespac.cache_kernels", "moespac.trace"]),
    ("policies", ["moespac.scheduler", "baselines", "moespac.registry", "moespac.catalogue"]),
    ("drivers", ["moespac.engine", "moespac.sim", "moespac.numerics", "moespac.lossless"]),
    ("runs", ["moespac.bench", "moespac.import_trace", "moespac.ar_trace", "baselines.programs", "moespac.experiments",
              "moespac.workflow_checks"]),
    ("outputs", ["moespac.analysis", "moespac.tracking", "moespac.manifest", "moespac.study_plan"]),
    ("entry points", ["moespac.cli", "moespac.commands", "moespac.__main__", "moespac"]),
]


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its body."""

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges = defaultdict(set)
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [known(f"{base}.{a.name}") or known(base) for a in node.names]
            else:
                continue
            edges[mod].update(t for t in targets if t and t != mod)
    return edges


def layer_of(mod: str) -> int:
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            covers = mod == p or (mod.startswith(p + ".") and p != "moespac")  # the package itself: its __init__ only
            if covers and p.count(".") > depth:
                best, depth = i, p.count(".")
    if best is None:
        raise AssertionError(f"{mod} is in no layer of tests/test_layers.py LAYERS: add it where it belongs")
    return best


def upward_edges() -> list[tuple[str, str]]:
    mods = modules()
    return sorted((a, b) for a, bs in imports(mods).items() for b in bs if layer_of(b) > layer_of(a))


def test_every_module_has_a_layer():
    for mod in modules():
        layer_of(mod)


def test_no_import_points_up_a_layer():
    up = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})" for a, b in upward_edges()]
    assert not up, "imports that point up a layer:\n" + "\n".join(up)


def test_the_walker_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    # a walker that missed function-level imports would pass the test above vacuously
    pkg = tmp_path / "moespac"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from moespac import errors\n    from . import b\n")
    (pkg / "sub" / "b.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("moespac",))
    assert imports(modules())["moespac.sub.a"] == {"moespac.errors", "moespac.sub.b"}


def main() -> int:
    mods = modules()
    edges = imports(mods)

    def part(mod: str) -> str:  # a top-level module or subpackage; the baseline policies as one
        if mod.startswith("baselines") and not mod.startswith("baselines.programs"):
            return "baselines"
        return ".".join(mod.split(".")[:2])

    graph = defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            if part(a) != part(b):
                graph[part(a)].add(part(b))
    for i, (name, _) in reversed(list(enumerate(LAYERS))):
        print(f"[{i}] {name}")
        for p in sorted({part(m) for m in mods if layer_of(m) == i}):
            print(f"    {p} -> {', '.join(sorted(graph[p])) or '-'}")
    up = upward_edges()
    print(f"\n{len(up)} import(s) point up a layer" + "".join(f"\n    {a} -> {b}" for a, b in up))
    return 1 if up else 0


if __name__ == "__main__":
    sys.exit(main())
