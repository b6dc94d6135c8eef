"""scripts/check_architecture.py: the stack drawn in docs/architecture.md against the import
contracts of pyproject.toml."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_architecture", ROOT / "scripts/check_architecture.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _check(doc: str) -> list[str]:
    script = _script()
    contracts = script.read_contracts(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    return script.disagreements(script.read_drawing(doc), contracts)


def test_it_finds_the_drawing_and_the_contracts_in_agreement() -> None:
    assert _check((ROOT / "docs/architecture.md").read_text()) == []


def test_it_reports_an_arrow_against_a_contract() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    turned = doc.replace("    transitions --> selectors\n", "    selectors --> transitions\n")
    assert (
        "contract 'tasks_app' puts tasks_app.transitions above tasks_app.selectors; "
        "the drawing, below"
    ) in _check(turned)


def test_it_reports_a_module_missing_from_the_drawing() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    assert "tasks_app.webhooks (contract 'apps') is in no box of the drawing" in _check(
        doc.replace(", tasks_app.webhooks<br/>", "<br/>")
    )


def test_it_reports_a_drawn_module_no_contract_places() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    added = doc.replace("tasks_app.tracing<br/>", "tasks_app.tracing, tasks_app.nowhere<br/>")
    problems = _check(added)
    assert "tasks_app.nowhere is drawn but no layers contract places it" in problems
    assert "tasks_app.nowhere is drawn but does not exist" in problems


def test_it_reports_independent_modules_joined_by_an_arrow() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    joined = doc.replace(
        "    listing --> selectors\n", "    listing --> selectors\n    transitions --> listing\n"
    )
    assert (
        "contract 'tasks_app' keeps tasks_app.listing and tasks_app.transitions apart; "
        "arrows join them"
    ) in _check(joined)
