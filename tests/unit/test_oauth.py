"""JwtVerifier: a JWT access token is accepted only when a key of the set signed it, for this
server, from the issuer, unexpired, naming a subject; anything else is None, never raised."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

import jwt
import pytest

from mcp_sandbox.oauth import JwksError, JwtVerifier, principal_of_subject
from mcp_sandbox.principals import FirstOf, StaticTokens
from tests.issuer import ISSUER, RESOURCE, Issuer, jwks_url, write_jwks

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer()


@pytest.fixture
def verifier(issuer: Issuer, tmp_path: Path) -> JwtVerifier:
    return JwtVerifier(str(write_jwks(tmp_path / "jwks.json", issuer)), ISSUER, RESOURCE)


async def test_a_token_of_the_issuer_for_this_server_names_its_subject(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    caller = await verifier.verify_token(issuer.token("alice", scope="run read", azp="agent-7"))
    assert caller is not None
    assert (caller.principal, caller.subject, caller.client_id) == ("alice", "alice", "agent-7")
    assert caller.scopes == ["run", "read"]
    assert caller.resource == RESOURCE and caller.expires_at is not None


def test_a_subject_that_is_no_folder_name_becomes_a_fixed_digest() -> None:
    principal = principal_of_subject("auth0|5f7c8ec7c33c6c004bbafe82")
    assert principal.startswith("sub-") and "|" not in principal
    assert principal == principal_of_subject("auth0|5f7c8ec7c33c6c004bbafe82")
    assert principal != principal_of_subject("auth0|5f7c8ec7c33c6c004bbafe83")
    assert principal_of_subject("../alice") != "../alice"


def hmac_signed(header: dict[str, object], payload: dict[str, object], secret: bytes) -> str:
    """A JWT signed by hand: PyJWT itself refuses to sign with a public key as an HMAC secret."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{part(json.dumps(header).encode())}.{part(json.dumps(payload).encode())}"
    return f"{signing_input}.{part(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


def forged_tokens(issuer: Issuer) -> dict[str, str]:
    """Tokens this server must refuse, by what is wrong with them."""
    stranger = Issuer(issuer.kid)  # the same kid, another key
    public_jwk = json.dumps(issuer.jwk())
    return {
        "expired": issuer.token("alice", lifetime_s=-120),
        "another issuer": Issuer(issuer.kid, issuer="https://evil.test").token("alice"),
        "iss claim of another issuer": issuer.token("alice", iss="https://evil.test"),
        "another audience": issuer.token("alice", audience="https://other.test/mcp"),
        "no audience": issuer.token("alice", aud=None),
        "no subject": issuer.token("", sub=None),
        "empty subject": issuer.token(""),
        "no expiry": issuer.token("alice", exp=None),
        "not yet valid": issuer.token("alice", nbf=int(time.time()) + 3600),
        "signed by another key": stranger.token("alice"),
        "unknown kid": Issuer("other-kid").token("alice"),
        "alg none": jwt.encode(
            {"iss": ISSUER, "sub": "alice", "aud": RESOURCE, "exp": 2**40},
            None,
            algorithm="none",
            headers={"kid": issuer.kid},
        ),
        # The public key used as a shared secret: the classic confusion attack.
        "HS256 keyed with the public key": hmac_signed(
            {"alg": "HS256", "typ": "JWT", "kid": issuer.kid},
            {"iss": ISSUER, "sub": "alice", "aud": RESOURCE, "exp": 2**40},
            public_jwk.encode(),
        ),
        "not a JWT": "alice-token-0123456789abcdef",
        "three dots": "a.b.c",
        "empty": "",
    }


async def test_every_forged_or_stale_token_is_refused(issuer: Issuer, verifier: JwtVerifier) -> None:
    accepted = {name for name, token in forged_tokens(issuer).items() if await verifier.verify_token(token)}
    assert not accepted


async def test_the_audience_may_be_given_with_or_without_a_trailing_slash_or_in_a_list(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    for audience in (RESOURCE + "/", [RESOURCE, "https://other.test"]):
        assert await verifier.verify_token(issuer.token("alice", aud=audience)) is not None, audience


async def test_a_rotated_key_file_is_read_again_and_a_broken_one_keeps_the_keys(
    issuer: Issuer, tmp_path: Path
) -> None:
    path = write_jwks(tmp_path / "jwks.json", issuer)
    verifier = JwtVerifier(str(path), ISSUER, RESOURCE)
    rotated = Issuer("rotated-key")
    assert await verifier.verify_token(rotated.token("alice")) is None
    write_jwks(path, rotated)
    os.utime(path, ns=(1, 1))  # a rewrite within one clock tick is still seen as a change
    assert await verifier.verify_token(rotated.token("alice")) is not None
    assert await verifier.verify_token(issuer.token("alice")) is None, (
        "a key taken out of the set still works"
    )
    path.write_text("{not json")
    assert await verifier.verify_token(rotated.token("alice")) is not None


def test_a_key_file_that_cannot_be_used_stops_the_start(tmp_path: Path) -> None:
    for text in ("{not json", '{"keys": []}', '{"keys": [{"kty": "nope"}]}'):
        (tmp_path / "jwks.json").write_text(text)
        with pytest.raises(JwksError, match="MCP_SANDBOX_AUTH_JWKS"):
            JwtVerifier(str(tmp_path / "jwks.json"), ISSUER, RESOURCE)
    with pytest.raises(JwksError, match="MCP_SANDBOX_AUTH_JWKS"):
        JwtVerifier(str(tmp_path / "missing.json"), ISSUER, RESOURCE)


async def test_a_key_set_at_a_url_is_fetched_once_and_kept(issuer: Issuer) -> None:
    curve = Issuer("curve-key", curve=True)
    with jwks_url(issuer, curve) as (url, fetched):
        verifier = JwtVerifier(url, ISSUER, RESOURCE)
        for signer in (issuer, curve, issuer):
            caller = await verifier.verify_token(signer.token("bob"))
            assert caller is not None and caller.principal == "bob", signer.algorithm
        assert len(fetched) == 1, fetched


async def test_an_unreachable_key_set_url_refuses_tokens_and_raises_nothing(issuer: Issuer) -> None:
    with jwks_url(issuer) as (url, _):
        pass  # the server is gone: its port refuses connections
    verifier = JwtVerifier(url, ISSUER, RESOURCE)
    assert await verifier.verify_token(issuer.token("bob")) is None


async def test_static_tokens_and_an_issuer_are_asked_in_turn(issuer: Issuer, verifier: JwtVerifier) -> None:
    either = FirstOf([StaticTokens("the-one-token-0123456789", None), verifier])
    static = await either.verify_token("the-one-token-0123456789")
    assert static is not None and static.principal == ""
    caller = await either.verify_token(issuer.token("carol"))
    assert caller is not None and caller.principal == "carol"
    assert await either.verify_token("the-one-token-0123456789 ") is None
