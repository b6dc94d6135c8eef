"""Fail when modules of tasks_app, elicitations and config import each other in a circle.

The graph is the one import-linter checks its contracts on (grimp's): every import statement
counts, at module level, inside functions and under ``if TYPE_CHECKING``. Modules that reach
each other form a tangle; each cycle in a tangle is printed as a chain of imports, and the
exit code is 1 if there is any.

Usage: python scripts/import_cycles.py
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grimp

# The checkout's packages, `config` among them: only the checkout names the settings package
# so (the installed project names it `taskdesk`, setup.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PACKAGES = ("tasks_app", "elicitations", "config")
MAX_CYCLES_SHOWN = 50  # per tangle


def direct_imports(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """Each module of PACKAGES, with the modules of PACKAGES it imports."""
    return {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}


def tangles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that all reach each other (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in sorted(imports[module]):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(imports):
        if module not in order:
            visit(module)
    return sorted(found)


def cycles(tangle: list[str], imports: dict[str, set[str]]) -> Iterator[list[str]]:
    """Every simple cycle inside TANGLE, each once: it starts at its alphabetically first module."""
    members = set(tangle)
    for start in tangle:
        paths = [[start]]
        while paths:
            path = paths.pop()
            for imported in sorted(imports[path[-1]] & members, reverse=True):
                if imported == start:
                    yield [*path, start]
                elif imported > start and imported not in path:
                    paths.append([*path, imported])


def import_lines(
    graph: grimp.ImportGraph, runtime_graph: grimp.ImportGraph, importer: str, imported: str
) -> Iterator[str]:
    """The statements by which IMPORTER imports IMPORTED, marking the type-only ones."""
    at_runtime = {
        line["line_number"]
        for line in runtime_graph.get_import_details(importer=importer, imported=imported)
    }
    for line in graph.get_import_details(importer=importer, imported=imported):
        note = "" if line["line_number"] in at_runtime else " (under TYPE_CHECKING)"
        yield f"{importer}:{line['line_number']} imports {imported}{note}"


def main() -> int:
    graph = grimp.build_graph(*PACKAGES)
    runtime_graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    imports = direct_imports(graph)
    found = tangles(imports)
    for tangle in found:
        print(f"Import cycle among {len(tangle)} modules: {', '.join(tangle)}")
        for count, cycle in enumerate(cycles(tangle, imports)):
            if count == MAX_CYCLES_SHOWN:
                print(f"  ... and more (only the first {MAX_CYCLES_SHOWN} are shown)")
                break
            print("  " + " -> ".join(cycle))
        print("  through:")
        for importer in tangle:
            for imported in sorted(imports[importer] & set(tangle)):
                for line in import_lines(graph, runtime_graph, importer, imported):
                    print("    " + line)
    if found:
        print(f"{len(found)} import cycle group(s) in {', '.join(PACKAGES)}")
        return 1
    print(f"No import cycles in {', '.join(PACKAGES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
