"""One layer order, imports pointing one way (CPU, no imports executed: the sources are parsed).

Layers, bottom to top; a module imports only from layers below its own, or from its own package:
    core -> kernels -> layers, config -> data, targets -> decoding -> methods -> recipes -> drafts
    -> runtime, launch -> eval, export, train, distill, vlm -> cli, testing
No circle among modules either, and no private name (`_x`) imported from another module.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

REPO = Path(__file__).resolve().parents[1]
LAYERS: List[Set[str]] = [
    {"specdraft.core"},
    {"specdraft.kernels"},
    {"specdraft.layers", "specdraft.config"},
    {"specdraft.data", "specdraft.targets"},
    {"specdraft.decoding"},
    {"specdraft.methods"},
    {"specdraft.recipes"},
    {"specdraft.drafts"},
    {"specdraft.runtime", "specdraft.launch"},
    {"specdraft.eval", "specdraft.export", "specdraft.train", "specdraft.distill", "specdraft.vlm"},
    {"specdraft.cli", "specdraft.testing"},  # testing: for the tests and the suites, imported by no module here
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def package_sources(root: Path = REPO) -> Dict[str, str]:
    """{dotted module name: source} of every module of specdraft."""
    sources = {}
    for path in sorted((root / "specdraft").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text()
    return sources


def unit_of(module: str) -> str:
    """The layered unit a module belongs to (its top package below specdraft), '' for the root."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else ""


def imports_of(source: str) -> List[Tuple[str, List[str]]]:
    """Every import of a module, function-level ones included -> [(imported module, names taken from it)]."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def internal_graph(sources: Dict[str, str]) -> Dict[str, Dict[str, List[str]]]:
    """{module: {imported module of ours: names}} (a `from package import module` counts as the module)."""
    graph = {}
    for module, source in sources.items():
        edges: Dict[str, List[str]] = {}
        for target, names in imports_of(source):
            if unit_of(target) == "" and not target.startswith("specdraft"):
                continue
            for name in names or [""]:
                submodule = f"{target}.{name}"
                resolved = submodule if submodule in sources else target
                if resolved in sources:
                    edges.setdefault(resolved, []).append(name)
        graph[module] = edges
    return graph


def back_arrows(graph) -> List[str]:
    """Imports from a unit of the same or a higher layer (other than the module's own unit)."""
    bad = []
    for module, edges in graph.items():
        source_unit = unit_of(module)
        for target in edges:
            target_unit = unit_of(target)
            if target_unit == source_unit or target_unit == "":
                continue
            if source_unit not in RANK or target_unit not in RANK:
                bad.append(f"{module} -> {target}: a unit outside the layer order (add it to LAYERS)")
            elif RANK[target_unit] >= RANK[source_unit]:
                bad.append(f"{module} -> {target}")
    return bad


def circles(graph) -> List[List[str]]:
    """Module-level import cycles (depth-first search)."""
    found, state, stack = [], {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in graph.get(module, {}):
            if state.get(target) == "open":
                found.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def private_imports(graph) -> List[str]:
    return [f"{module} imports {name} from {target}" for module, edges in graph.items()
            for target, names in edges.items() for name in names if name.startswith("_") and target != module]


def test_every_unit_is_in_the_layer_order():
    units = {unit_of(module) for module in package_sources()} - {""}
    assert units <= set(RANK), f"units missing from LAYERS: {sorted(units - set(RANK))}"


def test_imports_point_down_with_no_circle_and_no_private_name():
    graph = internal_graph(package_sources())
    assert back_arrows(graph) == []
    assert circles(graph) == []
    assert private_imports(graph) == []


def test_a_planted_back_arrow_and_circle_are_caught():
    sources = package_sources()
    sources["specdraft.core.types"] += "\nfrom specdraft.decoding.engine import SpecEngine\n"
    graph = internal_graph(sources)
    assert "specdraft.core.types -> specdraft.decoding.engine" in back_arrows(graph)
    assert any(cycle[0] == cycle[-1] and "specdraft.core.types" in cycle for cycle in circles(graph))
    sources["specdraft.runtime.load"] += "\nfrom specdraft.decoding.engine import _sync_helper\n"
    assert any("_sync_helper" in line for line in private_imports(internal_graph(sources)))
