"""Fail when the stack drawn in docs/architecture.md and the import contracts disagree.

The drawing is the first mermaid block of the page. Each box names its modules before its
first ``<br/>`` (``tasks_app.selectors, tasks_app.listing<br/>what they do``); ``a --> b``
draws a above b (a may import b), and an arrow from or to a subgraph stands for every box in
it; dotted arrows (``-. text .->``) say something else and are skipped. The contracts are the
``layers`` contracts of pyproject.toml's ``[tool.importlinter]``.

They disagree when
- a module of a contract is in no box, or a box names a module that no contract places, or
  one that does not exist;
- the drawing puts B above A (a path of arrows from B's box to A's) where a contract puts A
  in a higher layer than B;
- a contract puts A above B, their boxes are in different groups, and no path of arrows
  leads from A's box to B's (within a group, boxes without arrows leave the order to the
  contracts);
- a contract says two modules of one layer are independent (``|``) and an arrow joins them.

Run from the project's root: ``python scripts/check_architecture.py``; exit 1 on any
disagreement, each printed on a line.
"""

from __future__ import annotations

import itertools
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PYPROJECT = ROOT / "pyproject.toml"

BOX = re.compile(r'(\w+)\["([^"]*)"\]')
SUBGRAPH = re.compile(r"^\s*subgraph\s+(\w+)")
DOTTED = re.compile(r'-\.\s*"[^"]*"\s*\.->|-\.->')
MODULE = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+$")


@dataclass
class Drawing:
    modules: dict[str, str] = field(default_factory=dict)  # module -> box
    group: dict[str, str] = field(default_factory=dict)  # box -> innermost subgraph ("" top)
    members: dict[str, list[str]] = field(default_factory=dict)  # subgraph -> boxes
    edges: set[tuple[str, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def boxes(self, name: str) -> list[str]:
        return self.members.get(name, [name])

    def below(self, box: str) -> set[str]:
        """Every box a path of arrows leads to from BOX."""
        seen: set[str] = set()
        todo = [box]
        while todo:
            current = todo.pop()
            for a, b in self.edges:
                if a == current and b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen


def read_drawing(text: str) -> Drawing:
    block = re.search(r"```mermaid\n(.*?)```", text, re.S)
    drawing = Drawing()
    if block is None:
        drawing.problems.append(f"{DOC.name}: no mermaid block")
        return drawing
    stack: list[str] = []
    chains: list[list[str]] = []
    for line in block.group(1).splitlines():
        opened = SUBGRAPH.match(line)
        if opened:
            stack.append(opened.group(1))
            drawing.members[opened.group(1)] = []
            continue
        if line.strip() == "end":
            stack.pop()
            continue
        for box, label in BOX.findall(line):
            drawing.group[box] = stack[-1] if stack else ""
            for outer in stack:
                drawing.members[outer].append(box)
            for name in (n.strip() for n in label.split("<br/>")[0].split(",")):
                if not MODULE.match(name):
                    drawing.problems.append(f"box {box}: {name!r} is not a module name")
                elif name in drawing.modules:
                    drawing.problems.append(f"{name} is in boxes {drawing.modules[name]}, {box}")
                else:
                    drawing.modules[name] = box
        solid = DOTTED.split(BOX.sub(r"\1", line))[0]
        if "-->" in solid:
            chains.append([part.strip() for part in solid.split("-->")])
    for chain in chains:
        for upper, lower in itertools.pairwise(chain):
            for a in drawing.boxes(upper):
                for b in drawing.boxes(lower):
                    drawing.edges.add((a, b))
    return drawing


@dataclass
class Contract:
    name: str
    layers: list[list[str]]  # top first; each layer's modules
    independent: list[bool]  # whether each layer's modules must not import each other


def read_contracts(config: dict[str, object]) -> list[Contract]:
    found = []
    tool = config["tool"]
    assert isinstance(tool, dict)
    for raw in tool["importlinter"]["contracts"]:
        if raw.get("type") != "layers":
            continue
        prefix = "".join(f"{c}." for c in raw.get("containers", []))
        layers, independent = [], []
        for layer in raw["layers"]:
            names = [n.strip().strip("()") for n in re.split(r"[|:]", layer) if n.strip()]
            layers.append([prefix + n for n in names])
            independent.append("|" in layer)
        found.append(Contract(raw["id"], layers, independent))
    return found


def exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def disagreements(drawing: Drawing, contracts: list[Contract]) -> list[str]:
    out = list(drawing.problems)
    placed = {m for c in contracts for layer in c.layers for m in layer}
    for module in sorted(set(drawing.modules) - placed):
        out.append(f"{module} is drawn but no layers contract places it")
    for module in sorted(m for m in drawing.modules if not exists(m)):
        out.append(f"{module} is drawn but does not exist")
    below = {box: drawing.below(box) for box in drawing.group}
    for contract in contracts:
        where = f"contract {contract.name!r}"
        for i, layer in enumerate(contract.layers):
            for a in layer:
                if a not in drawing.modules:
                    out.append(f"{a} ({where}) is in no box of the drawing")
                    continue
                box_a = drawing.modules[a]
                for j, other in enumerate(contract.layers[i:], start=i):
                    for b in other:
                        box_b = drawing.modules.get(b)
                        if box_b is None or box_b == box_a or (i == j and b <= a):
                            continue
                        if i == j:
                            if contract.independent[i] and (
                                box_b in below[box_a] or box_a in below[box_b]
                            ):
                                out.append(f"{where} keeps {a} and {b} apart; arrows join them")
                        elif box_a in below[box_b]:
                            out.append(f"{where} puts {a} above {b}; the drawing, below")
                        elif (
                            box_b not in below[box_a]
                            and drawing.group[box_a] != drawing.group[box_b]
                        ):
                            out.append(f"{where} puts {a} above {b}; no arrows lead there")
    return out


def main() -> int:
    drawing = read_drawing(DOC.read_text())
    contracts = read_contracts(tomllib.loads(PYPROJECT.read_text()))
    problems = disagreements(drawing, contracts)
    for problem in problems:
        print(f"docs/architecture.md and pyproject.toml disagree: {problem}")
    if not problems:
        print(f"The drawing agrees with {len(contracts)} layers contracts.")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
