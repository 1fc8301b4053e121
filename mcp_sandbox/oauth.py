"""OAuth resource-server mode: JWT access tokens from one issuer, for this server, checked against
the issuer's JSON Web Key Set (MCP_SANDBOX_AUTH_JWKS: a file, or an https:// URL). The caller's
principal is the token's `sub`. It is a TokenVerifier, so the MCP SDK's bearer middleware, its
RFC 9728 protected-resource metadata and its session-owner checks do the rest."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Any

import anyio.to_thread
import jwt

from mcp_sandbox.principals import PRINCIPAL_PATTERN, Caller, JwksError, WatchedFile

logger = logging.getLogger(__name__)

#: Public-key algorithms only: a JWKS is public, so a shared-secret (HS*) token signed with it proves nothing.
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
#: Seconds of clock difference forgiven in `exp`, `nbf` and `iat`.
LEEWAY_S = 30
#: Seconds a JWKS fetched from a URL is kept before it is fetched again.
JWKS_LIFESPAN_S = 300


def principal_of_subject(subject: str) -> str:
    """The principal a token's `sub` names: the subject itself when it is a principal's name,
    else a fixed digest of it (subjects such as "auth0|5f7c" hold characters a folder cannot)."""
    if re.fullmatch(PRINCIPAL_PATTERN, subject):
        return subject
    return "sub-" + hashlib.sha256(subject.encode()).hexdigest()[:32]


def _read_keys(path: Path) -> jwt.PyJWKSet:
    try:
        return jwt.PyJWKSet.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, jwt.PyJWTError) as error:
        raise JwksError(f"MCP_SANDBOX_AUTH_JWKS {path} is not a usable JSON Web Key Set: {error}") from None


def _key_of(keys: jwt.PyJWKSet, kid: str | None) -> jwt.PyJWK | None:
    """The key `kid` names; without a kid, the set's only key."""
    if kid is None:
        return keys.keys[0] if len(keys.keys) == 1 else None
    try:
        return keys[kid]
    except KeyError:
        return None


class JwtVerifier:
    """Accepts a JWT access token signed by a key of the set, from `issuer`, for `resource`
    (its `aud`), not expired, with a `sub`. Never raises: a token it cannot check is refused."""

    def __init__(self, jwks: str, issuer: str, resource: str) -> None:
        """Raises JwksError when a JWKS file cannot be used (a URL is fetched at the first token)."""
        self._issuer = issuer
        self._resource = resource
        # RFC 8707 names the resource by URL; a trailing slash is not a different resource.
        self._audiences = [resource, resource.rstrip("/"), resource.rstrip("/") + "/"]
        self._file = (
            None
            if jwks.startswith(("https://", "http://"))
            else WatchedFile(Path(jwks).expanduser(), _read_keys, JwksError)
        )
        self._client = (
            jwt.PyJWKClient(jwks, lifespan=JWKS_LIFESPAN_S, timeout=10) if self._file is None else None
        )

    async def _key(self, token: str) -> jwt.PyJWK | None:
        if self._file is not None:
            return _key_of(self._file.current(), jwt.get_unverified_header(token).get("kid"))
        assert self._client is not None
        client = self._client
        kept = client.jwk_set_cache.get() if client.jwk_set_cache is not None else None
        kid = jwt.get_unverified_header(token).get("kid")
        if kept is not None and kid is not None and (key := _key_of(kept, kid)) is not None:
            return key  # a key of the set still kept: no fetch, so no thread
        # urllib, so off the event loop; the client caches the set and limits refetches on unknown keys.
        return await anyio.to_thread.run_sync(client.get_signing_key_from_jwt, token)

    async def verify_token(self, token: str) -> Caller | None:
        try:
            key = await self._key(token)
            if key is None:
                return None
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[key.algorithm_name] if key.algorithm_name in ALGORITHMS else [],
                audience=self._audiences,
                issuer=self._issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except (jwt.PyJWTError, ValueError) as error:
            logger.debug("a bearer token was refused: %s", error)
            return None
        except Exception:  # a verifier that raised would answer the caller 500, not 401
            logger.warning("a bearer token could not be checked", exc_info=True)
            return None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            return None
        scope = claims.get("scope")
        return Caller(
            token=token,
            client_id=str(claims.get("client_id") or claims.get("azp") or subject),
            scopes=scope.split() if isinstance(scope, str) else [],
            expires_at=int(claims["exp"]),
            resource=self._resource,
            subject=subject,
            claims={"iss": claims["iss"]},
            principal=principal_of_subject(subject),
        )
