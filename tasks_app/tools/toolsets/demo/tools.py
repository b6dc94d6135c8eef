"""The demo toolset (on by default): tools for trying Taskdesk and for its tests.

- ``export_report`` writes a report file through an effect with a verify hook;
- ``refund_payment`` asks an operator to approve large refunds, then refunds once;
- ``confirm_action`` asks the MCP client to confirm;
- ``slow_echo`` waits, checking for cancellation, and echoes its text;
- ``send_notice`` sends a notice through the demo outbox, an effect with no verify hook.

Their "outside world" is Taskdesk's own storage: the export folder
(``TASKDESK_EXPORT_DIR``, which every worker must share) and the ``DemoRefund`` table, which
stands in for a payment provider that refuses a refund key it has already seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from pydantic import BaseModel, Field

from tasks_app.tools import ToolContext, ToolError, ToolResult, Toolset
from tasks_app.tools.results import text as text_block
from tasks_app.tools.toolsets.demo.models import DemoRefund

tools = Toolset("demo")

QUARTERS = ("Q1", "Q2", "Q3", "Q4")
REGIONS = ("north", "south", "east", "west")
# The write log of the export folder: one line per export renamed into place. "An export is
# written once" is checked against it.
WRITE_LOG = "writes.log"
CHUNKS = 10


# --- export_report ------------------------------------------------------------------------


class ExportResult(BaseModel):
    # A name, not the server's path: the folder is the server's business (there is no download
    # endpoint; an operator finds the file under TASKDESK_EXPORT_DIR).
    file: str = Field(description="The export's file name in the server's export folder")
    format: Literal["csv", "json"]
    rows: int
    sha256: str = Field(description="SHA-256 of the file, lower-case hex")


def _export_dir() -> Path:
    folder = Path(settings.TASKDESK_EXPORT_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _row(quarter: str, i: int) -> dict[str, Any]:
    # Deterministic, so every leg (and the verify hook) produces the same bytes.
    q = QUARTERS.index(quarter) + 1
    return {
        "quarter": quarter,
        "row": i + 1,
        "region": REGIONS[(i * 7 + q) % len(REGIONS)],
        "amount_cents": (i * 7919 + q * 104_729) % 1_000_000,
    }


def _render(quarter: str, fmt: str, rows: range) -> bytes:
    if fmt == "csv":
        lines = [
            f"{r['quarter']},{r['row']},{r['region']},{r['amount_cents']}\n"
            for r in (_row(quarter, i) for i in rows)
        ]
        return "".join(lines).encode()
    # JSON: one object per row, joined into a single array by the caller.
    return b",\n".join(json.dumps(_row(quarter, i), sort_keys=True).encode() for i in rows)


def _chunks_of(quarter: str, fmt: str, rows: int, ctx: ToolContext) -> list[bytes]:
    """Generate the report in chunks, with progress and checkpoints, in about half the time."""
    pause = settings.TASKDESK_DEMO_EXPORT_SECONDS / 2 / CHUNKS
    size = max(1, -(-rows // CHUNKS))
    parts: list[bytes] = []
    for chunk in ctx.chunks(rows, size):
        parts.append(_render(quarter, fmt, chunk))
        ctx.progress(chunk.stop, rows, f"Generating {quarter} rows")
        ctx.sleep(pause)
    if fmt == "csv":
        return [b"quarter,row,region,amount_cents\n", *parts]
    body = [b"[\n"]
    for i, part in enumerate(parts):
        body += [b",\n", part] if i else [part]
    return [*body, b"\n]\n"]


def _sha256(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def _remove_partials(folder: Path, task_id: str) -> None:
    # Temporary files of this task's earlier legs (a leg killed mid-write): never an export.
    for partial in folder.glob(f".{task_id}.*.part"):
        partial.unlink(missing_ok=True)


def _write_atomically(final: Path, parts: list[bytes], ctx: ToolContext) -> None:
    """Write PARTS to a temporary file beside FINAL in about half the export time (the slow
    storage of a real export), then fsync and rename it into place."""
    pause = settings.TASKDESK_DEMO_EXPORT_SECONDS / 2 / max(1, len(parts))
    tmp = final.with_name(f".{final.name}.{os.urandom(4).hex()}.part")
    with tmp.open("wb") as handle:
        for i, part in enumerate(parts, 1):
            handle.write(part)
            ctx.progress(i, len(parts), "Writing the export")
            time.sleep(pause)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    folder = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _log_write(folder: Path, entry: dict[str, Any]) -> None:
    line = json.dumps(entry, sort_keys=True) + "\n"
    # One short O_APPEND write: lines of concurrent writers never interleave.
    fd = os.open(folder / WRITE_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@tools.tool(
    task="required",
    requires_idempotency_key=True,
    output_schema=ExportResult,
    annotations={
        "title": "Export a quarterly report",
        "readOnlyHint": False,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    },
)
def export_report(
    ctx: ToolContext,
    quarter: Annotated[Literal["Q1", "Q2", "Q3", "Q4"], Field(description="The quarter")],
    format: Annotated[Literal["csv", "json"], Field(description="File format")] = "csv",
    rows: Annotated[int, Field(ge=1, le=100_000, description="Number of rows")] = 1000,
) -> ToolResult:
    """Export a quarter's report as a CSV or JSON file.

    Generates the rows in chunks (the task's status message shows the progress), then writes
    the file atomically. Returns its file name, format, number of rows and SHA-256. Needs an
    idempotency key: a retry with the same key returns the same export.
    """
    folder = _export_dir()
    final = folder / f"{ctx.task_id}.{format}"
    _remove_partials(folder, str(ctx.task_id))
    parts = _chunks_of(quarter, format, rows, ctx)
    expected = hashlib.sha256(b"".join(parts)).hexdigest()

    def written(key: str) -> bool:
        return _sha256(final) == expected

    def remove(key: str) -> None:
        if _sha256(final) == expected:
            final.unlink()

    with ctx.effect("write_export", target=str(final), verify=written, compensate=remove) as fx:
        if not fx.done:
            _write_atomically(final, parts, ctx)
            written_at = timezone.now().isoformat()
            entry = {"task": ctx.task_id, "path": str(final), "sha256": expected, "at": written_at}
            _log_write(folder, entry)
            fx.record(path=str(final), sha256=expected)
    structured = ExportResult(file=final.name, format=format, rows=rows, sha256=expected)
    return ToolResult(
        content=[
            text_block(
                f"Exported {rows} rows of {quarter} as {format} to the file {final.name} "
                f"(sha256 {expected})."
            )
        ],
        structured=structured.model_dump(),
    )


# --- refund_payment ---------------------------------------------------------------------------


class RefundResult(BaseModel):
    refund_id: str
    payment_id: str
    amount_cents: int


# The decision is the answer itself, one of two named options with no default: whoever answers
# must pick Approve or Decline (a form's Accept button only sends the answer).
APPROVAL_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "description": "Approve refunds the payment; Decline refuses the refund.",
            "oneOf": [
                {"const": "approve", "title": "Approve"},
                {"const": "decline", "title": "Decline"},
            ],
        },
        "note": {"type": "string", "title": "Note", "maxLength": 500},
    },
    "required": ["decision"],
}


class DuplicateRefund(Exception):
    """The provider already has a refund with this key."""


def _refund_id(refund: DemoRefund) -> str:
    return f"rf_{refund.pk:08d}"


def issue_refund(*, key: str, payment_id: str, amount_cents: int, reason: str) -> DemoRefund:
    """The demo provider's refund call: refuses a key it has seen, like a real provider's
    idempotency check, so no failure anywhere else can refund one request twice (the refusal
    is counted in ``DemoRefund.refused_calls``). It takes
    ``TASKDESK_DEMO_REFUND_SECONDS``, half before the refund is made and half after."""
    latency = settings.TASKDESK_DEMO_REFUND_SECONDS / 2
    time.sleep(latency)
    try:
        with transaction.atomic():
            refund = DemoRefund.objects.create(
                downstream_key=key, payment_id=payment_id, amount_cents=amount_cents, reason=reason
            )
    except IntegrityError:
        # Counted, as a provider's logs would show the repeated request.
        DemoRefund.objects.filter(downstream_key=key).update(refused_calls=F("refused_calls") + 1)
        raise DuplicateRefund(f"a refund with key {key} already exists") from None
    time.sleep(latency)
    return refund


def _money(cents: int) -> str:
    return f"{cents // 100:,}.{cents % 100:02d}"


def _decision(content: dict[str, Any]) -> str:
    """The operator's decision. A question asked before the form named its decision had a
    required "approve" boolean instead; only ``true`` approved."""
    if "decision" in content:
        return str(content["decision"])
    return "approve" if content.get("approve") is True else "decline"


@tools.tool(
    task="required",
    requires_idempotency_key=True,
    key_argument="request_key",
    output_schema=RefundResult,
    annotations={
        "title": "Refund a payment",
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": True,
        "openWorldHint": True,
    },
)
def refund_payment(
    ctx: ToolContext,
    payment_id: Annotated[
        str, Field(min_length=1, max_length=200, description="The payment to refund")
    ],
    amount_cents: Annotated[int, Field(ge=1, description="Amount to refund, in cents")],
    reason: Annotated[str, Field(max_length=2000, description="Why the refund is made")],
    request_key: Annotated[
        str | None,
        Field(description="Idempotency key of this refund request: repeat it on a retry"),
    ] = None,
) -> ToolResult:
    """Refund part or all of a payment, exactly once.

    Large refunds wait for an operator's approval in the Taskdesk inbox. The idempotency key
    (request_key, or the Idempotency-Key header) makes a retry return the original refund
    instead of refunding twice. Returns the refund id.
    """
    if amount_cents >= settings.TASKDESK_REFUND_APPROVAL_CENTS:
        answer = ctx.ask(
            "approval",
            message=f"Approve a refund of {_money(amount_cents)} on payment {payment_id}? "
            f"Reason given: {reason}",
            schema=APPROVAL_FORM,
            audience="operator",
        )
        if not answer.accepted:
            raise ToolError(
                f"Refund of {payment_id} was not approved by an operator: "
                f"the question was {'declined' if answer.action == 'decline' else 'cancelled'}"
            )
        if _decision(answer.content) != "approve":
            note = str(answer.content.get("note") or "").strip() or "no note given"
            raise ToolError(f"Refund of {payment_id} was declined by an operator: {note}")

    def refunded(key: str) -> bool:
        return DemoRefund.objects.filter(downstream_key=key).exists()

    with ctx.effect("refund", target=payment_id, verify=refunded) as fx:
        if not fx.done:
            refund = issue_refund(
                key=fx.key, payment_id=payment_id, amount_cents=amount_cents, reason=reason
            )
            fx.record(refund_id=_refund_id(refund))
    refund = DemoRefund.objects.get(downstream_key=fx.key)
    structured = RefundResult(
        refund_id=_refund_id(refund), payment_id=payment_id, amount_cents=amount_cents
    )
    return ToolResult(
        content=[
            text_block(
                f"Refunded {_money(amount_cents)} on payment {payment_id}: "
                f"refund {_refund_id(refund)}."
            )
        ],
        structured=structured.model_dump(),
    )


# --- confirm_action -----------------------------------------------------------------------------


class Confirmation(BaseModel):
    confirmed: bool


CONFIRM_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "title": "Confirm"}},
    "required": ["confirm"],
}


@tools.tool(
    task="required",
    output_schema=Confirmation,
    annotations={"title": "Confirm an action", "readOnlyHint": True, "openWorldHint": False},
)
def confirm_action(
    ctx: ToolContext,
    action: Annotated[str, Field(max_length=2000, description="What to confirm")],
) -> ToolResult:
    """Ask the user, through the MCP client, to confirm an action; returns whether they did."""
    answer = ctx.ask("confirm", message=f"Confirm: {action}", schema=CONFIRM_FORM)
    confirmed = answer.accepted and answer.content.get("confirm") is True
    if confirmed:
        summary = f"Confirmed: {action}"
    elif answer.accepted:
        summary = f"Not confirmed: {action}"
    else:
        how = "declined" if answer.action == "decline" else "cancelled"
        summary = f"Not confirmed (the question was {how}): {action}"
    return ToolResult(
        content=[text_block(summary)], structured=Confirmation(confirmed=confirmed).model_dump()
    )


# --- slow_echo --------------------------------------------------------------------------------------


@tools.tool(
    task="optional",
    annotations={"title": "Echo slowly", "readOnlyHint": True, "openWorldHint": False},
)
def slow_echo(
    ctx: ToolContext,
    text: Annotated[str, Field(description="What to echo")],
    seconds: Annotated[float, Field(ge=0, le=3600, description="How long to wait")] = 5,
) -> str:
    """Echo the text back after some seconds (checking for cancellation every 0.2 s)."""
    ctx.sleep(seconds, every=0.2)
    return text


# --- send_notice --------------------------------------------------------------------------------

# The demo outbox: one JSON line per notice sent, in the demo storage folder.
OUTBOX = "outbox.jsonl"


class NoticeResult(BaseModel):
    notice_id: str
    to: str


def sent_notices(folder: Path | None = None) -> list[dict[str, Any]]:
    """The notices the demo outbox has sent, oldest first."""
    path = (folder or _export_dir()) / OUTBOX
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@tools.tool(
    task="required",
    requires_idempotency_key=True,
    key_argument="request_key",
    output_schema=NoticeResult,
    annotations={
        "title": "Send a notice",
        "readOnlyHint": False,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": True,
    },
)
def send_notice(
    ctx: ToolContext,
    to: Annotated[str, Field(min_length=1, max_length=200, description="Recipient")],
    subject: Annotated[str, Field(max_length=200, description="Subject line")],
    body: Annotated[str, Field(max_length=10_000, description="Text of the notice")],
    request_key: Annotated[
        str | None,
        Field(description="Idempotency key of this notice: repeat it on a retry"),
    ] = None,
) -> ToolResult:
    """Send a notice to a recipient through the demo outbox, once.

    The outbox cannot be asked afterwards whether a notice went out, so the effect has no
    verify hook: if the worker dies while sending, an operator decides in the task's effects
    ledger whether it happened. Needs an idempotency key.
    """
    with ctx.effect("send_notice", target=to) as fx:
        if not fx.done:
            # The outbox's latency; a worker killed here leaves the effect unknown.
            time.sleep(settings.TASKDESK_DEMO_NOTICE_SECONDS)
            entry = {"key": fx.key, "to": to, "subject": subject, "body": body}
            entry["at"] = timezone.now().isoformat()
            line = json.dumps(entry, sort_keys=True) + "\n"
            fd = os.open(_export_dir() / OUTBOX, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
            fx.record(notice_id=fx.key)
    structured = NoticeResult(notice_id=fx.key, to=to)
    return ToolResult(
        content=[text_block(f"Sent the notice {subject!r} to {to}.")],
        structured=structured.model_dump(),
    )
