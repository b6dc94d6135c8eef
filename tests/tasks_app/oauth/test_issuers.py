"""Access tokens of an external identity provider (a local Keycloak-shaped realm): which are
accepted, as which client, and that every other one is 401 invalid_token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tasks_app.models import Client, Task
from tasks_app.oauth import bearer, issuers
from tests.tasks_app.mcp.conftest import Mcp
from tests.tasks_app.oauth.conftest import INVALID_CHALLENGE, RESOURCE, new_key
from tests.wire import result_of

pytestmark = pytest.mark.django_db


def refused(client, token: str) -> None:  # type: ignore[no-untyped-def]
    response = Mcp(client, token).call("tools/list")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == INVALID_CHALLENGE
    assert json.loads(response.content)["error"]["message"] == (
        "The bearer token is unknown or revoked"
    )


def unsigned(claims: dict, header: dict) -> str:
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part(header)}.{part(claims)}."


# --- accepted ---------------------------------------------------------------------------------


def test_a_mapped_app_acts_as_its_client(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    mcp = Mcp(client, keycloak.token())

    result = result_of(mcp.call("tools/call", {"name": "slow_echo", "arguments": {"text": "hi"}},
                                tasks=True))  # fmt: skip

    task = Task.objects.get(pk=result["taskId"])
    assert task.client == alice


def test_it_reads_the_access_the_token_grants(keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    token = keycloak.token(scope="openid tasks:call offline_access")

    access = bearer.verify(token)

    assert access is not None
    assert access.client == alice
    assert access.scopes == {"tasks:call"}
    assert access.issuer == keycloak.issuer
    assert access.app == "claude-desktop"
    assert access.expires_at == jwt.decode(token, options={"verify_signature": False})["exp"]


@pytest.mark.parametrize(
    "aud", [RESOURCE, [RESOURCE, "account"], "HTTPS://TASKDESK.example.com/mcp/", RESOURCE + "/"]
)
def test_the_audience_is_compared_after_normalisation(keycloak, alice, aud) -> None:  # type: ignore[no-untyped-def]
    assert bearer.verify(keycloak.token(aud=aud)) is not None


def test_scp_lists_are_read_when_there_is_no_scope_claim(keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    access = bearer.verify(keycloak.token(scope=None, scp=["tasks:answer"]))

    assert access is not None and access.scopes == {"tasks:answer"}


def test_a_configured_client_claim_names_the_app(keycloak, alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_OAUTH_ISSUERS = (keycloak.settings_entry(client_claim="client_id"),)

    assert bearer.verify(keycloak.token(azp="other", client_id="claude-desktop")) is not None
    assert bearer.verify(keycloak.token(azp="claude-desktop", client_id="other")) is None


def test_client_id_names_the_app_when_there_is_no_azp(keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    access = bearer.verify(keycloak.token(azp=None, client_id="claude-desktop"))

    assert access is not None and access.client == alice


def test_an_ec_signed_token_is_accepted(keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = {**jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": "ec-1"}
    keycloak.documents[keycloak.jwks_path]["keys"].append(jwk)

    assert bearer.verify(keycloak.token(key=key, kid="ec-1", alg="ES256")) is not None


def test_keys_are_discovered_from_the_realm_metadata(keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    assert bearer.verify(keycloak.token()) is not None

    assert keycloak.fetches == {
        "/realms/acme/.well-known/openid-configuration": 1,
        keycloak.jwks_path: 1,
    }


def test_a_configured_jwks_uri_is_used_as_it_is(keycloak, alice, settings) -> None:  # type: ignore[no-untyped-def]
    entry = keycloak.settings_entry(jwks_uri=keycloak.base + keycloak.jwks_path)
    settings.TASKDESK_OAUTH_ISSUERS = (entry,)

    assert bearer.verify(keycloak.token()) is not None
    assert keycloak.fetches == {keycloak.jwks_path: 1}


# --- key rotation -----------------------------------------------------------------------------


def test_tokens_of_a_rotated_key_are_accepted(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    assert result_of(Mcp(client, keycloak.token()).call("tools/list"))
    old_key, old_kid = keycloak.key, keycloak.kid

    keycloak.rotate()

    assert result_of(Mcp(client, keycloak.token()).call("tools/list"))
    assert keycloak.fetches[keycloak.jwks_path] == 2
    # The old key left the set: a token it signs now names an unknown key.
    refused(client, keycloak.token(key=old_key, kid=old_kid))


def test_an_unknown_key_id_fetches_the_keys_at_most_once_per_interval(
    keycloak, alice, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_OAUTH_JWKS_REFETCH_SECONDS = 60
    assert bearer.verify(keycloak.token()) is not None

    for n in range(5):
        assert bearer.verify(keycloak.token(kid=f"made-up-{n}")) is None

    assert keycloak.fetches[keycloak.jwks_path] == 1


# --- refused ----------------------------------------------------------------------------------


def test_a_token_for_another_resource_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    refused(client, keycloak.token(aud="https://other.example.com/mcp"))
    refused(client, keycloak.token(aud=["account", "https://taskdesk.example.com/mcp/other"]))
    refused(client, keycloak.token(aud=None))


def test_a_token_of_another_issuer_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    refused(client, keycloak.token(iss="https://id.example.com/realms/other"))
    refused(client, keycloak.token(iss=keycloak.issuer + "/"))


def test_an_expired_token_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    now = int(time.time())
    refused(client, keycloak.token(iat=now - 600, exp=now - issuers.LEEWAY_SECONDS - 5))
    refused(client, keycloak.token(exp=None))
    # Within the leeway, clocks may disagree.
    assert bearer.verify(keycloak.token(exp=now - 5)) is not None


def test_a_token_not_yet_valid_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    refused(client, keycloak.token(nbf=int(time.time()) + 600))


def test_a_token_signed_with_an_unknown_key_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    stranger = new_key()
    refused(client, keycloak.token(key=stranger))  # the realm's kid, another key
    refused(client, keycloak.token(key=stranger, kid="someone-else"))


def test_an_unsigned_token_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    refused(client, unsigned(keycloak.claims(), {"alg": "none", "kid": keycloak.kid}))
    refused(client, unsigned(keycloak.claims(), {"alg": "none"}))


def test_hs256_with_the_public_key_as_secret_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    public = keycloak.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "kid": keycloak.kid, "typ": "JWT"}
    signing_input = unsigned(keycloak.claims(), header).rstrip(".")
    signature = hmac.new(public, signing_input.encode(), hashlib.sha256).digest()
    forged = f"{signing_input}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"

    refused(client, forged)


def test_a_token_whose_algorithm_differs_from_its_key_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    refused(client, keycloak.token(alg="PS256"))  # the realm's key says RS256


def test_garbage_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    for token in ("not-a-jwt", "a.b.c", "x" * (bearer.MAX_TOKEN_CHARS + 1)):
        refused(client, token)


# --- subjects ---------------------------------------------------------------------------------


def test_an_unknown_app_is_refused(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    refused(client, keycloak.token(azp="some-other-app"))
    refused(client, keycloak.token(azp=None))


def test_an_app_mapped_to_a_missing_client_is_refused(client, keycloak, settings) -> None:  # type: ignore[no-untyped-def]
    refused(client, keycloak.token())  # alice does not exist in this test


def test_create_clients_makes_a_client_in_the_tenant_the_token_names(
    client, keycloak, alice, settings
) -> None:  # type: ignore[no-untyped-def]
    entry = keycloak.settings_entry(clients={}, create_clients=True, tenant_claim="tenant")
    settings.TASKDESK_OAUTH_ISSUERS = (entry,)

    assert result_of(Mcp(client, keycloak.token(azp="cursor", tenant="globex")).call("tools/list"))

    made = Client.objects.get(name="127.0.0.1:cursor")
    assert made.tenant.slug == "globex"
    # The next token of that app acts as the same client.
    access = bearer.verify(keycloak.token(azp="cursor", tenant="globex", jti="second"))
    assert access is not None and access.client == made
    assert Client.objects.filter(name__startswith="127.0.0.1:").count() == 1


def test_create_clients_refuses_a_token_without_its_tenant(
    client, keycloak, alice, settings
) -> None:  # type: ignore[no-untyped-def]
    entry = keycloak.settings_entry(clients={}, create_clients=True, tenant_claim="tenant")
    settings.TASKDESK_OAUTH_ISSUERS = (entry,)

    refused(client, keycloak.token(azp="cursor"))
    refused(client, keycloak.token(azp="cursor", tenant="not a slug!"))
    refused(client, keycloak.token(azp="cursor", tenant=["acme"]))
    assert not Client.objects.filter(name="127.0.0.1:cursor").exists()


def test_create_clients_refuses_a_client_of_another_tenant(
    client, keycloak, alice, settings
) -> None:  # type: ignore[no-untyped-def]
    entry = keycloak.settings_entry(clients={}, create_clients=True, tenant_claim="tenant")
    settings.TASKDESK_OAUTH_ISSUERS = (entry,)
    assert bearer.verify(keycloak.token(azp="cursor", tenant="globex")) is not None
    bearer.forget_cached()

    refused(client, keycloak.token(azp="cursor", tenant="acme"))


def test_mapped_apps_come_before_created_clients(keycloak, alice, settings) -> None:  # type: ignore[no-untyped-def]
    entry = keycloak.settings_entry(create_clients=True, tenant_claim="tenant")
    settings.TASKDESK_OAUTH_ISSUERS = (entry,)

    access = bearer.verify(keycloak.token(tenant="globex"))

    assert access is not None and access.client == alice


# --- cost -------------------------------------------------------------------------------------


def test_a_verified_token_is_remembered_for_a_few_seconds(
    keycloak, alice, settings, django_assert_num_queries
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOKEN_CACHE_SECONDS = 60
    token = keycloak.token()
    assert bearer.verify(token) is not None
    fetched = sum(keycloak.fetches.values())

    with django_assert_num_queries(0):
        assert bearer.verify(token) is not None
    assert sum(keycloak.fetches.values()) == fetched


def test_a_token_is_never_remembered_past_its_expiry(keycloak, alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOKEN_CACHE_SECONDS = 3600
    token = keycloak.token(exp=int(time.time()) + 2)
    assert bearer.verify(token) is not None

    [(trusted_until, _)] = bearer._recent.values()

    assert trusted_until <= time.monotonic() + 2
