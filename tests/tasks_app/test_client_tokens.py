from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tasks_app import tokens
from tasks_app.models import Client, ClientToken


def create_token(client: str, tenant: str) -> str:
    out = StringIO()
    call_command("create_client_token", client=client, tenant=tenant, stdout=out, stderr=StringIO())
    return out.getvalue().strip().splitlines()[-1]


def test_it_creates_the_client_and_prints_a_token_as_the_last_line(db) -> None:  # type: ignore[no-untyped-def]
    token = create_token("ci-bot", "acme")

    client = Client.objects.get(name="ci-bot")
    assert client.tenant.slug == "acme"
    assert tokens.client_for_token(token) == client


def test_it_stores_only_a_keyed_hash(db) -> None:  # type: ignore[no-untyped-def]
    token = create_token("ci-bot", "acme")

    row = ClientToken.objects.get()
    assert token not in row.token_hash
    assert len(row.token_hash) == 64
    assert row.token_hash == tokens.hash_token(token)
    assert token.startswith(row.prefix)


def test_each_call_issues_another_token_for_the_same_client(db) -> None:  # type: ignore[no-untyped-def]
    first, second = create_token("ci-bot", "acme"), create_token("ci-bot", "acme")

    assert first != second
    assert Client.objects.count() == 1
    assert tokens.client_for_token(first) == tokens.client_for_token(second)


def test_it_refuses_a_client_of_another_tenant(db) -> None:  # type: ignore[no-untyped-def]
    create_token("ci-bot", "acme")

    with pytest.raises(CommandError, match="already exists in tenant 'acme'"):
        create_token("ci-bot", "globex")


def test_revoke_disables_every_token_of_the_client(db) -> None:  # type: ignore[no-untyped-def]
    first, second = create_token("ci-bot", "acme"), create_token("ci-bot", "acme")
    other = create_token("other", "acme")

    call_command("revoke_client_token", client="ci-bot", stdout=StringIO())

    assert tokens.client_for_token(first) is None
    assert tokens.client_for_token(second) is None
    assert tokens.client_for_token(other) is not None


def test_revoke_names_an_unknown_client(db) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CommandError, match="no client named 'ghost'"):
        call_command("revoke_client_token", client="ghost")


@pytest.mark.parametrize("token", ["", "tdk_", "tdk_nope", "Bearer x", "x" * 500])
def test_unknown_tokens_authenticate_nobody(db, token: str) -> None:  # type: ignore[no-untyped-def]
    create_token("ci-bot", "acme")

    assert tokens.client_for_token(token) is None


def test_a_process_trusts_a_looked_up_token_for_a_few_seconds(
    db, django_assert_num_queries, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOKEN_CACHE_SECONDS = 60
    token = create_token("ci-bot", "acme")
    client = tokens.client_for_token(token)

    with django_assert_num_queries(0):
        assert tokens.client_for_token(token) == client


def test_with_the_cache_off_every_lookup_reads_the_database(
    db, django_assert_num_queries, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOKEN_CACHE_SECONDS = 0
    token = create_token("ci-bot", "acme")
    tokens.client_for_token(token)

    with django_assert_num_queries(1):
        tokens.client_for_token(token)


def test_revoking_forgets_cached_tokens_at_once_in_this_process(db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOKEN_CACHE_SECONDS = 60
    token = create_token("ci-bot", "acme")
    assert tokens.client_for_token(token) is not None

    call_command("revoke_client_token", client="ci-bot", stdout=StringIO())

    assert tokens.client_for_token(token) is None
