"""The throughput chart's bars as SVG elements.

Built here rather than in the template: one ``format_html_join`` instead of a template loop
of sixty iterations (``bench/dashboard.py`` times the page). Only numbers and times go in.
"""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html_join
from django.utils.safestring import SafeString

BAR = (
    "<g><title>{} UTC: {} accepted, {} finished</title>"
    '<rect class="bar-accepted" x="{}" y="{}" width="{}" height="{}"></rect>'
    '<rect class="bar-finished" x="{}" y="{}" width="{}" height="{}"></rect></g>'
)


def bars(geometry: list[dict[str, Any]]) -> SafeString:
    """The bars of GEOMETRY (``chart._bar``), leaving out empty minutes."""
    return format_html_join(
        "",
        BAR,
        (
            (f"{b['minute']:%H:%M}", b["accepted"], b["finished"], *_rects(b))
            for b in geometry
            if b["accepted"] or b["finished"]
        ),
    )


def _rects(b: dict[str, Any]) -> tuple[Any, ...]:
    """x, y, width and height of the accepted bar, then of the finished one."""
    return (b["ax"], b["ay"], b["w"], b["ah"], b["fx"], b["fy"], b["w"], b["fh"])
