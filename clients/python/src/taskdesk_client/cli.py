"""``taskdesk-client call TOOL --arg k=v ... [--wait] [--key K]`` and ``taskdesk-client resume``.

Both take ``--url``, ``--token`` and ``--journal``, or ``TASKDESK_URL``, ``TASKDESK_TOKEN`` and
``TASKDESK_JOURNAL``. ``call`` prints the task id, then, with ``--wait``, the result as JSON;
``resume`` prints one line per submission it settled: its key and its task id.

Exit codes: 0 done; 1 the tool or the task ended in error; 2 bad usage or a refused call;
3 no answer from the server (the submission stays journaled: run ``taskdesk-client resume``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from taskdesk_client.client import (
    Client,
    Handle,
    Refused,
    TaskCancelled,
    TaskdeskError,
    TaskFailed,
    Unreachable,
)
from taskdesk_client.journal import KeyReused

OK, TOOL_ERROR, USAGE, UNREACHABLE = 0, 1, 2, 3


def parse_arguments(pairs: Sequence[str]) -> dict[str, Any]:
    """``k=v`` pairs as tool arguments: a value is read as JSON when it parses (``500``,
    ``true``, ``[1, 2]``, ``{"a": 1}``, ``'"123"'`` for the string 123), else as a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--arg {pair!r}: write it as name=value")
        try:
            out[name] = json.loads(value)
        except ValueError:
            out[name] = value
    return out


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("TASKDESK_URL"), help="MCP endpoint")
    common.add_argument("--token", default=os.environ.get("TASKDESK_TOKEN"), help="bearer token")
    common.add_argument(
        "--journal",
        default=os.environ.get("TASKDESK_JOURNAL"),
        help="SQLite journal (default: in the user's data directory)",
    )
    parser = argparse.ArgumentParser(
        prog="taskdesk-client", description="Call Taskdesk tools without ever losing a receipt."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    call = commands.add_parser(
        "call", parents=[common], help="journal a call, send it, print its task id"
    )
    call.add_argument("tool")
    call.add_argument(
        "--arg", action="append", default=[], metavar="NAME=VALUE", help="a tool argument"
    )
    call.add_argument("--key", help="the idempotency key (default: a new one)")
    call.add_argument("--wait", action="store_true", help="wait for the end; print the result")
    call.add_argument("--timeout", type=float, default=None, help="seconds --wait waits")
    commands.add_parser(
        "resume", parents=[common], help="resend journaled calls that have no receipt yet"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.url:
        print("taskdesk-client: give the MCP endpoint with --url or TASKDESK_URL", file=sys.stderr)
        return USAGE
    with Client(args.url, token=args.token, journal=args.journal) as client:
        try:
            if args.command == "resume":
                return _resume(client)
            return _call(client, args)
        except Unreachable as exc:
            print(f"taskdesk-client: {exc}; run `taskdesk-client resume` later", file=sys.stderr)
            return UNREACHABLE
        except (Refused, KeyReused, ValueError) as exc:
            print(f"taskdesk-client: {exc}", file=sys.stderr)
            return USAGE


def _call(client: Client, args: argparse.Namespace) -> int:
    arguments = parse_arguments(args.arg)
    handle = client.submit(args.tool, arguments, key=args.key)
    if handle.task_id is not None:
        print(handle.task_id, flush=True)
    if not args.wait and handle.task_id is not None:
        return OK
    return _print_result(handle, args.timeout)


def _print_result(handle: Handle, timeout: float | None) -> int:
    told: set[str] = set()
    while True:
        task = handle.wait(timeout, until_input=True)
        if task.get("status") != "input_required":
            break
        new = set(handle.input_requests) - told
        if new:
            print(
                f"taskdesk-client: task {handle.task_id} waits for input ({', '.join(sorted(new))}); "
                "answer it in the Taskdesk inbox or through tasks/update",
                file=sys.stderr,
            )
            told |= new
        handle.client.sleep(max(0.05, (task.get("pollIntervalMs") or 1000) / 1000))
    try:
        result = handle.result(timeout)
    except TaskFailed as exc:
        print(json.dumps({"error": exc.as_dict()}), flush=True)
        return TOOL_ERROR
    except TaskCancelled as exc:
        print(f"taskdesk-client: {exc}", file=sys.stderr)
        return TOOL_ERROR
    print(json.dumps(result), flush=True)
    return TOOL_ERROR if result.get("isError") else OK


def _resume(client: Client) -> int:
    worst = OK
    for outcome in client.resume():
        if outcome.error is None:
            print(f"{outcome.key} {outcome.task_id or '-'}", flush=True)
            continue
        print(f"taskdesk-client: {outcome.key} ({outcome.tool}): {outcome.error}", file=sys.stderr)
        code = UNREACHABLE if isinstance(outcome.error, Unreachable) else USAGE
        worst = max(worst, code) if isinstance(outcome.error, TaskdeskError) else worst
    return worst


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
