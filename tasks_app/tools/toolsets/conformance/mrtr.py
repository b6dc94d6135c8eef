"""The conformance suite's MRTR tools: ``input_required`` results on synchronous calls
(SEP-2322)."""

from __future__ import annotations

from tasks_app.tools import Answer, ProtocolError, ToolContext
from tasks_app.tools.toolsets.conformance.fixtures import (
    CONFIRM_FORM,
    NAME_FORM,
    ask_name_and_greet,
    sampled_text,
    text_form,
    tools,
)

# --- MRTR: input_required results on synchronous calls (SEP-2322) ----------------------


def _ask_model_for_capital(ctx: ToolContext) -> str:
    """Ask the client's model for the capital of France and say what it answered."""
    result = ctx.request_input(
        "capital_question",
        "sampling/createMessage",
        {
            "messages": [
                {
                    "role": "user",
                    "content": {"type": "text", "text": "What is the capital of France?"},
                }
            ],
            "maxTokens": 100,
        },
    )
    return f"The model said: {sampled_text(result)}"


def _confirm(ctx: ToolContext) -> Answer:
    """Ask for the one checkbox the requestState fixtures carry across a retry."""
    return ctx.ask("confirm", message="Please confirm", schema=CONFIRM_FORM)


@tools.tool
def test_input_required_result_elicitation(ctx: ToolContext) -> str:
    """Ask for a name, then greet."""
    return ask_name_and_greet(ctx)


@tools.tool
def test_input_required_result_sampling(ctx: ToolContext) -> str:
    """Ask the client's model a question."""
    return _ask_model_for_capital(ctx)


@tools.tool
def test_input_required_result_list_roots(ctx: ToolContext) -> str:
    """Ask for the client's roots."""
    result = ctx.request_input("client_roots", "roots/list", {})
    uris = [root.get("uri", "?") for root in result.get("roots", []) if isinstance(root, dict)]
    return f"Client roots: {', '.join(uris) or 'none'}"


@tools.tool
def test_input_required_result_request_state(ctx: ToolContext) -> str:
    """Ask for a confirmation across a signed requestState."""
    answer = _confirm(ctx)
    # Reaching here on a retry means the server verified the echoed requestState.
    return f"state-ok: confirmation {answer.action}"


@tools.tool
def test_input_required_result_multiple_inputs(ctx: ToolContext) -> str:
    """Ask for a name, a model greeting and the roots in one round."""
    results = ctx.request_inputs(
        {
            "user_name": (
                "elicitation/create",
                {"mode": "form", "message": "What is your name?", "requestedSchema": NAME_FORM},
            ),
            "greeting": (
                "sampling/createMessage",
                {
                    "messages": [
                        {"role": "user", "content": {"type": "text", "text": "Generate a greeting"}}
                    ],
                    "maxTokens": 50,
                },
            ),
            "client_roots": ("roots/list", {}),
        }
    )
    name = (results["user_name"].get("content") or {}).get("name", "?")
    roots = len(results["client_roots"].get("roots", []))
    return f"{sampled_text(results['greeting'])} {name} ({roots} roots)"


@tools.tool
def test_input_required_result_multi_round(ctx: ToolContext) -> str:
    """Ask for a name, then (next round) for a favourite colour."""
    name = ctx.ask("step1", message="Step 1: What is your name?", schema=NAME_FORM)
    color = ctx.ask(
        "step2", message="Step 2: What is your favorite color?", schema=text_form("color")
    )
    return f"{name.content.get('name')} likes {color.content.get('color')}"


@tools.tool
def test_input_required_result_tampered_state(ctx: ToolContext) -> str:
    """Ask for a confirmation; a tampered requestState on the retry is refused."""
    return f"Confirmed: {_confirm(ctx).action}"


@tools.tool
def test_input_required_result_capabilities(ctx: ToolContext) -> str:
    """Ask with a form if the client can show one, otherwise ask its model."""
    try:
        return ask_name_and_greet(ctx)
    except ProtocolError as exc:
        if exc.code != -32021:
            raise
    return _ask_model_for_capital(ctx)
