"""The package's layers (docs/architecture.md): every import in hicachectl/, those inside functions included, points
down the layers or within one, and no module imports itself back through others. A plain walk of the import graph
with the standard library's ast, so the rule needs no tool of its own and fails naming the file and the import."""

from __future__ import annotations

import ast
import functools
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hicachectl"
# From the top down: a module may import its own layer and the layers below it, never one above.
LAYERS = ("cli", "ops", "plans", "rules", "config", "formats")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) for every hicachectl module this file imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "hicachectl":
            for alias in node.names:  # `from hicachectl.plans import storage` imports the module hicachectl.plans.storage
                sub = f"{node.module}.{alias.name}"
                found.append((node.lineno, sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "hicachectl"]
    return found


def layer(module: str) -> int | None:
    """The layer's rank (0 = top), None for the package's own entry points (hicachectl.__main__)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


@functools.cache
def graph() -> dict[str, list[tuple[int, str]]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_is_in_a_layer():
    loose = [m for m in graph() if layer(m) is None and m not in ("hicachectl", "hicachectl.__main__")]
    assert loose == [], f"modules outside the layers {LAYERS} (docs/architecture.md): {loose}"


def test_imports_point_down_the_layers():
    upward = [f"{m.replace('.', '/')}.py:{line} imports {target} ({LAYERS[layer(target)]} is above {LAYERS[layer(m)]})"
              for m, found in graph().items() if layer(m) is not None
              for line, target in found if layer(target) is not None and layer(target) < layer(m)]
    assert upward == [], "\n".join(upward)


def test_no_import_cycle():
    modules = graph()
    edges = {m: sorted({t for _, t in found if t != m and t in modules}) for m, found in modules.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in edges:
        if start not in state:
            visit(start, [start])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_package_inits_import_nothing_of_ours():
    """An __init__ that imported its modules would make every import of one module run them all (and hide cycles).
    rules/ is the exception by design: its __init__ registers the rule families of pass 2 and is validation's API."""
    heavy = [f"{p.relative_to(PACKAGE.parent)} imports {t}" for p in PACKAGE.rglob("__init__.py") if p.parent.name in LAYERS
             and p.parent.name != "rules" for _, t in imports(p)]
    assert heavy == [], heavy
