"""Idempotency keys on the wire: the three carriers of a ``tools/call`` and their rules.

A key may come in the ``Idempotency-Key`` HTTP header, in
``params._meta["dev.taskdesk/idempotencyKey"]``, or in a tool argument the tool declares as
its key argument. Two carriers with different values are an error; the same value twice is
fine. The handler resolves the carriers here and hands ``acceptance.accept`` one typed
``IdempotencyKey``. docs/idempotency.md describes the rules for clients.
"""

from __future__ import annotations

import re
from typing import Any

from tasks_app import acceptance
from tasks_app.acceptance import (
    ConflictingKeyCarriers,
    IdempotencyKey,
    IdempotencyKeyRequired,
    InvalidIdempotencyKey,
)
from tasks_app.models import Client
from tasks_app.tools import ToolSpec

HEADER = "Idempotency-Key"
META_KEY = "dev.taskdesk/idempotencyKey"

# 1 to 255 visible ASCII characters: no space, no control characters, nothing encoded.
_KEY_RE = re.compile(r"[\x21-\x7e]{1,255}")
_KEY_RULE = (
    "an idempotency key is 1 to 255 visible ASCII characters (0x21-0x7E: letters, digits "
    "and punctuation; no spaces, control characters or non-ASCII characters)"
)


def _carrier_label(carrier: str, tool: ToolSpec) -> str:
    if carrier == "header":
        return f"the {HEADER} header"
    if carrier == "meta":
        return f'params._meta["{META_KEY}"]'
    return f'the "{tool.key_argument}" argument'


def _found(
    tool: ToolSpec, arguments: dict[str, Any], header_key: str | None, meta_key: object | None
) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    if header_key is not None:
        # HTTP strips surrounding whitespace from field values (RFC 9110 §5.5).
        found.append(("header", header_key.strip(" \t")))
    if meta_key is not None:
        found.append(("meta", meta_key))
    if (
        tool.key_argument
        and isinstance(arguments, dict)
        and arguments.get(tool.key_argument) is not None
    ):
        found.append(("argument", arguments[tool.key_argument]))
    return found


def sent(
    *, tool: ToolSpec, arguments: dict[str, Any], header_key: str | None, meta_key: object | None
) -> bool:
    """Whether the call carries a key at all (valid or not)."""
    return bool(_found(tool, arguments, header_key, meta_key))


def resolve_key(
    *,
    tool: ToolSpec,
    arguments: dict[str, Any],
    header_key: str | None,
    meta_key: object | None,
) -> IdempotencyKey | None:
    """The key of a call from its three carriers, or None when none is used.

    Raise InvalidIdempotencyKey for a malformed key and ConflictingKeyCarriers when two
    carriers hold different keys. (Whether TOOL requires a key is ``accept``'s check.)
    """
    found = _found(tool, arguments, header_key, meta_key)
    for carrier, value in found:
        if not isinstance(value, str) or not _KEY_RE.fullmatch(value):
            what = "is not a string" if not isinstance(value, str) else "is not a valid key"
            raise InvalidIdempotencyKey(
                f"{_carrier_label(carrier, tool)} {what}: {_KEY_RULE}.",
                {"reason": "invalid_idempotency_key", "carrier": carrier},
            )
    if not found:
        return None
    key = found[0][1]
    disagreeing = [c for c, v in found if v != key]
    if disagreeing:
        first, second = found[0][0], disagreeing[0]
        raise ConflictingKeyCarriers(
            f"Two different idempotency keys were sent, in {_carrier_label(first, tool)} and "
            f"in {_carrier_label(second, tool)}. Send the key once, or the same value in each.",
            {"reason": "conflicting_idempotency_keys", "carriers": [first, second]},
        )
    assert isinstance(key, str)
    return IdempotencyKey(value=key, carrier="+".join(c for c, _ in found))


def accept(
    *,
    client: Client,
    tool: ToolSpec,
    arguments: dict[str, Any],
    era: str,
    header_key: str | None,
    meta_key: object | None,
    journal: list[dict[str, Any]] | None = None,
    client_answers: str | None = None,
    started_by: acceptance.StartedBy | None = None,
) -> acceptance.Receipt:
    """Accept a ``tools/call`` whose key came in its wire carriers: resolve the key, then
    ``acceptance.accept``; a refused keyless call says how to send a key."""
    key = resolve_key(tool=tool, arguments=arguments, header_key=header_key, meta_key=meta_key)
    try:
        return acceptance.accept(
            client=client,
            tool=tool,
            arguments=arguments,
            era=era,
            key=key,
            journal=journal,
            client_answers=client_answers,
            started_by=started_by,
        )
    except IdempotencyKeyRequired as exc:
        raise IdempotencyKeyRequired(required_message(tool), exc.data) from None


def required_message(tool: ToolSpec) -> str:
    ways = f'the {HEADER} HTTP header or params._meta["{META_KEY}"]'
    if tool.key_argument:
        ways = f'the {HEADER} HTTP header, params._meta["{META_KEY}"] or the "{tool.key_argument}" argument'
    return (
        f"{acceptance.key_required(tool)} Send one in {ways}: 1 to 255 visible ASCII "
        "characters, new for each call and the same on every retry of that call."
    )
