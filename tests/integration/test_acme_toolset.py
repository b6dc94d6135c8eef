"""A toolset from an installed package (examples/acme-tools, through the ``taskdesk.toolsets``
entry points), served by a live stack started with ``TASKDESK_TOOLSETS=demo,acme``: typed
arguments on the wire, an ``async def`` tool in a real worker, and start-up refusing an
unknown toolset."""

from __future__ import annotations

import json
import subprocess

import pytest
from taskdesk_client import Client

from tests.live import BIN, ROOT, LiveStack, live_stack

pytestmark = pytest.mark.live


def test_a_live_server_serves_an_installed_toolset(transactional_db, alice_token, tmp_path):
    outbox = tmp_path / "outbox.jsonl"
    env = {"TASKDESK_TOOLSETS": "demo,acme", "ACME_OUTBOX": str(outbox)}
    with (
        live_stack(env=env) as stack,
        Client(stack.mcp_url, token=alice_token, journal=tmp_path / "j.sqlite3") as client,
    ):
        listed = {tool["name"]: tool for tool in client.tools()}
        assert {"schedule_delivery", "quote_shipment", "export_report"} <= set(listed)
        props = listed["schedule_delivery"]["inputSchema"]["properties"]
        assert props["window_start"]["format"] == "date-time"
        assert "outputSchema" in listed["quote_shipment"]

        # The async tool, in the worker, with a question answered over tasks/update.
        quote = client.submit(
            "quote_shipment",
            {"weight_kg": "2.5", "destination": "US", "ship_on": "2026-12-03", "express": True},
        )
        quote.wait(timeout=60, until_input=True)
        [(key, request)] = quote.input_requests.items()
        assert request["params"]["message"] == "Express to US costs 36.25. Book it?"
        quote.answer(key, {"confirm": True})
        result = quote.result(timeout=60)
        assert result["structuredContent"] == {
            "destination": "US",
            "ship_on": "2026-12-03",
            "express": True,
            "price": "36.25",
        }

        delivery = client.submit(
            "schedule_delivery",
            {
                "order_id": "0b7f3c2e-5d5a-4a43-9a0e-2f1e3d4c5b6a",
                "window_start": "2026-12-02T08:00:00Z",
                "window_end": "2026-12-02T12:00:00+01:00",
                "address": {"street": "1 Main St", "city": "Springfield", "postcode": "SP1 2AB"},
            },
        )
        booked = delivery.result(timeout=60)
        assert not booked.get("isError"), booked
        assert booked["structuredContent"]["window_end"] == "2026-12-02T12:00:00+01:00"
        assert booked["structuredContent"]["priority"] == "normal"
        [line] = outbox.read_text().splitlines()
        assert json.loads(line)["booking"] == booked["structuredContent"]["booking"]


def test_an_unknown_toolset_stops_start_up_naming_the_available_ones(transactional_db):
    stack = LiveStack(env={"TASKDESK_TOOLSETS": "demo,acme,nope"}, worker=False, beat=False)
    try:
        checked = subprocess.run(
            [str(BIN / "python"), "manage.py", "check"],
            cwd=ROOT,
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stack.close()
    assert checked.returncode != 0
    assert (
        "TASKDESK_TOOLSETS names 'nope', which is neither a built-in toolset nor an installed "
        "one (available: acme, conformance, demo;"
    ) in checked.stderr
