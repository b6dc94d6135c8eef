"""TASKDESK_OAUTH_ISSUERS: read from JSON, each mistake refused with one line."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import OAuthIssuer, parse_oauth_issuers
from tests.config.test_setting_errors import manage, the_one_line

NAME = "TASKDESK_OAUTH_ISSUERS"


def test_it_reads_one_issuer_or_a_list() -> None:
    one = '{"issuer": "https://id.example.com/realms/acme", "clients": {"app": "acme-bot"}}'
    both = (
        '[{"issuer": "https://id.example.com/realms/acme", "clients": {"app": "acme-bot"}},'
        ' {"issuer": "https://login.example.org", "jwks_uri": "http://keys.internal/jwks",'
        '  "client_claim": "cid", "tenant_claim": "org", "scope_claim": "perms",'
        '  "create_clients": true}]'
    )

    assert parse_oauth_issuers(NAME, one) == (
        OAuthIssuer(issuer="https://id.example.com/realms/acme", clients={"app": "acme-bot"}),
    )
    assert parse_oauth_issuers(NAME, both)[1] == OAuthIssuer(
        issuer="https://login.example.org",
        jwks_uri="http://keys.internal/jwks",
        client_claim="cid",
        tenant_claim="org",
        scope_claim="perms",
        create_clients=True,
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[]", "TASKDESK_OAUTH_ISSUERS must be a JSON list of issuers such as"),
        ("[1]", "TASKDESK_OAUTH_ISSUERS[0] must be an object such as"),
        ('{"clients": {"a": "b"}}', "TASKDESK_OAUTH_ISSUERS[0].issuer is required"),
        (
            '{"issuer": "http://id.example.com", "clients": {"a": "b"}}',
            "TASKDESK_OAUTH_ISSUERS[0].issuer must be an https:// URL (http:// only on a "
            "loopback host), not 'http://id.example.com'",
        ),
        (
            '{"issuer": "https://id.example.com", "audience": "x", "clients": {"a": "b"}}',
            "TASKDESK_OAUTH_ISSUERS[0] has unknown keys audience; it takes issuer, jwks_uri,",
        ),
        (
            '{"issuer": "https://id.example.com", "clients": {"a": 1}}',
            "TASKDESK_OAUTH_ISSUERS[0].clients must map claim values to Taskdesk client names",
        ),
        (
            '{"issuer": "https://id.example.com", "create_clients": true}',
            "TASKDESK_OAUTH_ISSUERS[0].create_clients needs tenant_claim",
        ),
        (
            '{"issuer": "https://id.example.com"}',
            "TASKDESK_OAUTH_ISSUERS[0] accepts no token: map claim values to clients",
        ),
        (
            '[{"issuer": "https://id.example.com", "clients": {"a": "b"}},'
            ' {"issuer": "https://id.example.com", "clients": {"a": "b"}}]',
            "TASKDESK_OAUTH_ISSUERS lists the issuer https://id.example.com twice",
        ),
        (
            '[{"issuer": "https://id.example.com/realms/a", "create_clients": true,'
            ' "tenant_claim": "t"}, {"issuer": "https://id.example.com/realms/b",'
            ' "create_clients": true, "tenant_claim": "t"}]',
            "TASKDESK_OAUTH_ISSUERS: only one issuer on id.example.com may set create_clients",
        ),
    ],
)
def test_it_refuses_a_malformed_list(raw, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ImproperlyConfigured) as refused:
        parse_oauth_issuers(NAME, raw)

    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_a_malformed_list_stops_the_process_with_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = manage({NAME: '[{"issuer": "https://id.example.com"'}, tmp_path)

    assert the_one_line(result).startswith(f"Taskdesk cannot start: {NAME} must be JSON such as")
