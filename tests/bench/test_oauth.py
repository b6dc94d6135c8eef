"""bench/oauth.py's arithmetic: the order of the runs, the medians and the ratio to the target."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def oauth():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))  # it imports its siblings `acceptance` and `common`
    try:
        spec = importlib.util.spec_from_file_location("bench_oauth", BENCH / "oauth.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def runs(oauth, kind: str, *rates: float, web_ms: float = 2.0, errors: int = 0):  # type: ignore[no-untyped-def]
    return [
        oauth.Figures(kind, 1000, rate, 10.0, 50.0, errors, {"web": web_ms}, "new")
        for rate in rates
    ]


def test_the_tokens_take_turns_so_a_drift_weighs_on_both(oauth) -> None:  # type: ignore[no-untyped-def]
    assert oauth.order()[:4] == ["static", "oauth", "oauth", "static"]
    assert len(oauth.order()) == 4 * oauth.ROUNDS


def test_the_table_gives_the_medians_and_the_ratio_oauth_over_static(oauth) -> None:  # type: ignore[no-untyped-def]
    results = {
        "new": {"static": runs(oauth, "static", 400, 420, 380, 500),
                "oauth": runs(oauth, "oauth", 390, 400, 410, 100, web_ms=2.1)},
        "get": {"static": runs(oauth, "static", 1000, 1000),
                "oauth": runs(oauth, "oauth", 900, 900)},
    }  # fmt: skip

    rows = oauth.render(results, "2 cores").splitlines()

    assert rows[-2] == (
        "| accept (tools/call, new task) | 410 | 395 | 0.96 | 10.0 / 10.0 | 50.0 / 50.0 | "
        "2.00 / 2.10 | 0 | OAuth / static >= 0.95 (met) |"
    )
    assert rows[-1].startswith("| tasks/get | 1000 | 900 | 0.90 |")
    assert rows[-1].endswith("| OAuth / static >= 0.95 (**not met**) |")


def test_an_error_fails_the_target_whatever_the_rate(oauth) -> None:  # type: ignore[no-untyped-def]
    results = {
        "new": {"static": runs(oauth, "static", 400), "oauth": runs(oauth, "oauth", 400, errors=3)},
        "get": {"static": runs(oauth, "static", 900), "oauth": runs(oauth, "oauth", 950)},
    }

    rows = oauth.render(results, "2 cores").splitlines()

    assert rows[-2].endswith("| 3 | OAuth / static >= 0.95 (**not met**) |")
    assert rows[-1].endswith("| 0 | OAuth / static >= 0.95 (met) |")
