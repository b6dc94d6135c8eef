"""The throughput chart of the task list: bar geometry from per-minute counts."""

from __future__ import annotations

from typing import Any

from tasks_app.console import svg

WIDTH, HEIGHT, TOP = 600, 90, 12


def throughput_chart(minutes: list[dict[str, Any]]) -> dict[str, Any]:
    """The chart of MINUTES (``selectors.throughput_for_operator``): its size, peak, totals
    and bars (inline SVG, ``svg.bars``)."""
    slot = WIDTH / max(1, len(minutes))
    peak = max([1] + [max(m["accepted"], m["finished"]) for m in minutes])
    scale = (HEIGHT - TOP) / peak
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "peak": peak,
        "svg_bars": svg.bars([_bar(i, m, slot, scale) for i, m in enumerate(minutes)]),
        "accepted": sum(m["accepted"] for m in minutes),
        "finished": sum(m["finished"] for m in minutes),
    }


def _bar(i: int, minute: dict[str, Any], slot: float, scale: float) -> dict[str, Any]:
    """Minute I's two bars (accepted, finished) side by side in its slot."""
    x = i * slot
    a, f = minute["accepted"] * scale, minute["finished"] * scale
    return {
        "minute": minute["minute"],
        "accepted": minute["accepted"],
        "finished": minute["finished"],
        "ax": round(x + 1, 1),
        "fx": round(x + slot / 2, 1),
        "w": round(slot / 2 - 1, 1),
        "ay": round(HEIGHT - a, 1),
        "ah": round(a, 1),
        "fy": round(HEIGHT - f, 1),
        "fh": round(f, 1),
    }
