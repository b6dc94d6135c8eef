"""Tools that exercise the task runtime, for the runtime's unit and worker tests.

Enabled with ``TASKDESK_TOOLSETS=...,tests.runtime_toolset`` (the worker processes of the
integration tests import it by that module path). ``RUNS`` counts, per process, how often
each journaled body really ran; the worker tests count through the database instead.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

from tasks_app.tools import (
    MissingClientCapability,
    ProtocolError,
    Retry,
    ToolContext,
    ToolError,
    Toolset,
)

tools = Toolset("runtime_tests")

# What a test enables to use these tools: the default toolsets and this module.
RUNTIME_TOOLSETS = ["demo", "conformance", "tests.runtime_toolset"]

RUNS: Counter[str] = Counter()
OK_FORM = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
CONSENT_URL = "https://example.com/consent"
# Set by a test to make the next effect body "crash" (as if the worker died inside it).
CRASH_IN_EFFECT: set[str] = set()


class WorkerDied(BaseException):
    """Stands in for the process dying: not an Exception, so nothing records an outcome."""


@tools.tool(task="optional")
def noop(ctx: ToolContext) -> str:
    """Do nothing and return "ok"."""
    return "ok"


@tools.tool(task="required")
def outcome(ctx: ToolContext, how: str) -> Any:
    """End the way HOW says: value, structured, tool_error, exception, protocol_error."""
    if how == "structured":
        return {"answer": 42}
    if how == "tool_error":
        raise ToolError("the payment provider said no")
    if how == "exception":
        raise KeyError("missing-thing")
    if how == "protocol_error":
        raise ProtocolError("bad upstream", code=-32050, data={"upstream": "x"})
    if how == "not_json":
        return {"when": object()}
    return f"value {how}"


@tools.tool(task="forbidden")
def sync_outcome(ctx: ToolContext, how: str) -> Any:
    """``outcome`` run inside the request (a synchronous call)."""
    return outcome(ctx, how)


@tools.tool(task="required")
def steps(ctx: ToolContext, label: str = "a") -> dict[str, Any]:
    """Two steps around a question: the steps run once, whatever the number of legs."""

    def load() -> list[Any]:
        RUNS["load"] += 1
        return (1, label)  # a tuple: journaled and returned as a list on every leg

    loaded = ctx.step("load", load)
    answer = ctx.ask(
        "approve",
        message=f"Approve {label}?",
        schema={"type": "object", "properties": {"approve": {"type": "boolean"}}},
    )
    total = ctx.step("total", lambda: RUNS.update(["total"]) or 41)
    return {"loaded": loaded, "action": answer.action, "content": answer.content, "total": total}


@tools.tool(task="required")
def asks_operator(ctx: ToolContext) -> str:
    """One question for an operator."""
    answer = ctx.ask(
        "ok",
        message="Let it through?",
        schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
        audience="operator",
    )
    return f"{answer.action} {answer.content}"


@tools.tool(task="required")
def asks_anyone(ctx: ToolContext, mode: str = "form") -> str:
    """One question the client or an operator may answer (URL mode when MODE is "url")."""
    if mode == "url":
        answer = ctx.ask("consent", message="Open the page?", url=CONSENT_URL, audience="any")
    else:
        answer = ctx.ask("ok", message="Let it through?", schema=OK_FORM, audience="any")
    return f"{answer.action} {answer.content}"


@tools.tool(task="required")
def asks_or_goes_on(ctx: ToolContext) -> str:
    """Asks the client, and goes on without an answer when the client cannot give one."""
    try:
        answer = ctx.ask("ok", message="Go on?", schema=OK_FORM)
    except MissingClientCapability as exc:
        return f"went on without an answer (needs {exc.required})"
    return answer.action


@tools.tool(task="required")
def asks_two(ctx: ToolContext) -> dict[str, Any]:
    """Two questions at once: one for the client, one for an operator."""
    from tasks_app.tools import Question

    form = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    answers = ctx.ask_many(
        {
            "client_ok": Question(message="Client, ok?", schema=form),
            "operator_ok": Question(message="Operator, ok?", schema=form, audience="operator"),
        }
    )
    return {k: a.action for k, a in answers.items()}


@tools.tool(task="required")
def bad_schema(ctx: ToolContext) -> str:
    """Ask with a schema MCP does not allow, catch the error, and say what it was."""
    try:
        ctx.ask(
            "nested",
            message="?",
            schema={"type": "object", "properties": {"a": {"type": "object"}}},
        )
    except ValueError as exc:
        return f"refused: {exc}"
    return "asked"


@tools.tool(task="required")
def charge(ctx: ToolContext, verify: str = "none", fail: bool = False) -> dict[str, Any]:
    """One effect. VERIFY: none (no hook), yes, no, raise. The body counts its runs."""

    def check(key: str) -> bool:
        RUNS[f"verify:{key}"] += 1
        if verify == "raise":
            raise ConnectionError("provider unreachable")
        if verify == "operator_confirms_meanwhile":
            from django.contrib.auth import get_user_model

            from tasks_app import runtime
            from tasks_app.models import Effect

            olga = get_user_model().objects.get(username="olga")
            effect = Effect.objects.get(downstream_key=key)
            runtime.reconcile_effect(effect_id=effect.pk, happened=True, user=olga)
            return False  # the provider's answer lags behind the operator's
        return verify == "yes"

    with ctx.effect("charge", target="card-1", verify=None if verify == "none" else check) as fx:
        if not fx.done:
            RUNS["charge"] += 1
            if "charge" in CRASH_IN_EFFECT:
                CRASH_IN_EFFECT.discard("charge")
                raise WorkerDied()
            if fail:
                raise ConnectionRefusedError("card declined")
            fx.record(charge_id="ch_1")
    return {"key": fx.key, "detail": fx.detail, "done": fx.done}


@tools.tool(task="required")
def charge_then_ask(ctx: ToolContext) -> str:
    """An effect with a compensate hook, then a question (cancel it while it waits)."""

    def undo(key: str) -> None:
        RUNS[f"undo:{key}"] += 1

    with ctx.effect("reserve", compensate=undo) as fx:
        if not fx.done:
            RUNS["reserve"] += 1
    ctx.ask("go", message="Go on?")
    ctx.check_cancelled()
    return "done"


@tools.tool(task="required")
def effect_then_fail(ctx: ToolContext) -> str:
    """An effect with a compensate hook, then a tool error: the effect is compensated."""
    with ctx.effect("reserve", compensate=lambda key: RUNS.update([f"undo:{key}"])) as fx:
        if not fx.done:
            RUNS["reserve"] += 1
    raise ToolError("could not finish")


@tools.tool(task="required")
def ask_in_effect(ctx: ToolContext) -> str:
    """Asks a question inside an effect body, which the runtime refuses."""
    with ctx.effect("send"):
        ctx.ask("inside", message="?")
    return "unreachable"


@tools.tool(task="required")
def nondeterministic(ctx: ToolContext) -> str:
    """Names its first step after the clock: a different call on every leg."""
    ctx.step(f"stamp-{time.time_ns()}", lambda: 1)
    ctx.ask("again", message="Run another leg?")
    return "unreachable on a later leg"


@tools.tool(task="required")
def returns_early(ctx: ToolContext, flag_path: str) -> str:
    """Makes a journaled call only while FLAG_PATH exists (a non-deterministic ending)."""
    if os.path.exists(flag_path):
        ctx.step("only-sometimes", lambda: 1)
        ctx.ask("go", message="?")
    return "done"


@tools.tool(task="required", time_limit=0.5)
def busy(ctx: ToolContext, checkpoints: bool = True) -> str:
    """Runs past its 0.5 s time limit, with or without checkpoints."""
    if checkpoints:
        ctx.sleep(5)
    else:
        time.sleep(5)
    return "finished"


@tools.tool(task="required")
def sleeper(ctx: ToolContext, seconds: float = 5) -> str:
    """Sleeps with checkpoints, reporting progress."""
    steps_total = max(1, int(seconds / 0.1))
    for i in range(steps_total):
        ctx.progress(i, steps_total, "sleeping")
        ctx.sleep(0.1)
    return "awake"


@tools.tool(task="required")
def suicide(ctx: ToolContext) -> str:
    """Kills its own process with SIGKILL inside an effect, once per task (worker tests)."""
    from tasks_app.tools.toolsets.demo.models import DemoRefund

    with ctx.effect("mark") as fx:
        if not fx.done:
            _marker, created = DemoRefund.objects.get_or_create(
                downstream_key=f"suicide:{ctx.task_id}",
                defaults={"payment_id": "p", "amount_cents": 1},
            )
            if created:
                os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


@tools.tool(task="required")
def hands_over(ctx: ToolContext) -> str:
    """Another leg takes the task over while this one runs (as after a false death)."""
    from tasks_app.models import Task

    Task.objects.filter(pk=ctx.task_id).update(lease_owner="newer:1:abc")
    return "done"


@tools.tool(task="required", escalate=True)
def escalating_step(ctx: ToolContext) -> str:
    """Roll a number in a step before becoming a task, then report it from the task."""

    def roll() -> int:
        RUNS["escalating_step.roll"] += 1
        return RUNS["escalating_step.roll"]

    rolled = ctx.step("roll", roll)
    ctx.escalate()
    return f"rolled {rolled}"


@tools.tool(task="optional", escalate=True)
def slow_then_escalate(ctx: ToolContext, seconds: float = 30) -> str:
    """Work inside the request for SECONDS (checkpointing), then become a task."""
    ctx.sleep(seconds)
    ctx.escalate()
    return "done as a task"


@tools.tool(task="required", escalate=True)
def escalating_effect(ctx: ToolContext) -> str:
    """Start an effect before escalating (which a tool must not do)."""
    with ctx.effect("early"):
        pass
    ctx.escalate()
    return "unreachable"


@tools.tool(task="required")
def flaky_fetch(ctx: ToolContext, log_path: str, fail: int = 1, wait: float = 3) -> str:
    """A step that fails FAIL times with ConnectionError, retried after WAIT seconds; each
    attempt appends its time to LOG_PATH (the worker tests count through the file)."""

    def attempt() -> int:
        with open(log_path, "a") as out:
            out.write(f"{time.time()}\n")
        with open(log_path) as done:
            count = len(done.read().splitlines())
        if count <= fail:
            raise ConnectionError(f"attempt {count} failed")
        return count

    count = ctx.step("fetch", attempt, retry=Retry(attempts=3, backoff=2.0, max_delay=wait))
    return f"fetched on attempt {count}"


@tools.tool(task="required")
def loses_lease_in_effect(ctx: ToolContext, how: str = "taken_over") -> str:
    """Inside an effect body, the lease is lost as it is to a leg frozen past its lease: HOW
    is ``taken_over`` (a newer leg claimed the task) or ``expired`` (by the database's clock,
    nobody took over yet). The body counts its runs."""
    from datetime import timedelta

    from django.db.models import F
    from django.utils import timezone

    from tasks_app.models import Task

    with ctx.effect("charge", target="card-1") as fx:
        if not fx.done:
            RUNS["loses_lease_in_effect"] += 1
            past = timezone.now() - timedelta(seconds=5)
            leased = Task.objects.filter(pk=ctx.task_id)
            if how == "taken_over":
                leased.update(
                    lease_owner="newer:1:abc",
                    leg=F("leg") + 1,
                    lease_expires_at=timezone.now() + timedelta(seconds=30),
                )
            else:
                leased.update(lease_expires_at=past)
            fx.record(charge_id="ch_1")
    return "unreachable"


@tools.tool(task="required")
def refund_then_receipt(ctx: ToolContext, payment_id: str, receipt_down_flag: str) -> str:
    """A refund through the demo provider (an effect), then a receipt (a step) that fails
    while RECEIPT_DOWN_FLAG exists: the task fails after its effect applied."""
    from tasks_app.tools.toolsets.demo.tools import issue_refund

    with ctx.effect("refund", target=payment_id) as fx:
        if not fx.done:
            issue_refund(key=fx.key, payment_id=payment_id, amount_cents=500, reason="rerun test")

    def receipt() -> str:
        if os.path.exists(receipt_down_flag):
            raise ConnectionRefusedError("the receipt service is down")
        return f"receipt for {payment_id}"

    return ctx.step("receipt", receipt)
