"""Principals: who is calling. A server with a tokens file (MCP_SANDBOX_AUTH_TOKENS_FILE) or an
OAuth issuer (MCP_SANDBOX_AUTH_JWKS, in oauth.py) knows each caller by the principal its token
names, and everything a caller owns (its sessions, their checkpoints and leases, kept outputs,
output files, audit records) is scoped to it. Every other server has one principal, `SOLE`:
stdio, one MCP_SANDBOX_AUTH_TOKEN, or HTTP on loopback without a token.

Token checks are the MCP SDK's `TokenVerifier`s, so its bearer middleware answers 401 and binds
each MCP session to the caller that opened it."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from mcp.server.auth.provider import AccessToken

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A principal's name: it is a folder name under MCP_SANDBOX_OUTPUT_DIR, so nothing that walks.
PRINCIPAL_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}"
#: The one principal of a server without a tokens file; its sessions keep their names unprefixed.
SOLE = ""
#: How a tokens file gives a token's hash instead of the token.
SHA256_PREFIX = "sha256:"


class TokensFileError(Exception):
    """The tokens file cannot be used; the message says why and what to do."""


class JwksError(Exception):
    """The OAuth issuer's key set (oauth.py) cannot be used; the message says why and what to do."""


def output_folder(root: Path, principal: str, *, many: bool) -> Path:
    """Where a principal's output files go under MCP_SANDBOX_OUTPUT_DIR: its own folder. The sole
    principal's is the root itself, unless the server has other principals too (`many`): then it
    is `_sole`, which no principal's name can be, so none of its session folders is theirs."""
    if principal != SOLE:
        return root / principal
    return root / "_sole" if many else root


def scoped(principal: str, session_id: str) -> str:
    """The name a principal's session has inside this server and in the store: session ids
    cannot hold "/", so two principals' sessions of one name never meet."""
    return session_id if principal == SOLE else f"{principal}/{session_id}"


def _digests(path: Path) -> dict[str, bytes]:
    """The principal -> sha256(token) table of a tokens file. Raises TokensFileError."""
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            raw = file.read()
    except OSError as error:
        raise TokensFileError(f"MCP_SANDBOX_AUTH_TOKENS_FILE {path} cannot be read: {error}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokensFileError(
            f"MCP_SANDBOX_AUTH_TOKENS_FILE {path} is open to others (mode {stat.S_IMODE(mode):o}): "
            f"it must be readable by its owner only (chmod 600 {path})"
        )
    try:
        table = json.loads(raw)
    except ValueError as error:
        raise TokensFileError(f"MCP_SANDBOX_AUTH_TOKENS_FILE {path} is not JSON: {error}") from None
    if not isinstance(table, dict) or not table:
        raise TokensFileError(
            f'MCP_SANDBOX_AUTH_TOKENS_FILE {path} must be a JSON object {{"<principal>": "<token>"}}, '
            "with at least one principal"
        )
    digests: dict[str, bytes] = {}
    for principal, token in table.items():
        if not re.fullmatch(PRINCIPAL_PATTERN, principal):
            raise TokensFileError(
                f"MCP_SANDBOX_AUTH_TOKENS_FILE: {principal!r} is not a principal's name "
                f"(1-64 of letters, digits, _ . @ -, starting with a letter or digit)"
            )
        if not isinstance(token, str) or not token:
            raise TokensFileError(f"MCP_SANDBOX_AUTH_TOKENS_FILE: {principal!r} needs a token (a string)")
        if token.startswith(SHA256_PREFIX):
            try:
                digest = bytes.fromhex(token.removeprefix(SHA256_PREFIX))
            except ValueError:
                digest = b""
            if len(digest) != hashlib.sha256().digest_size:
                raise TokensFileError(
                    f"MCP_SANDBOX_AUTH_TOKENS_FILE: {principal!r}'s sha256: value is not 64 hex digits"
                )
        else:
            digest = hashlib.sha256(token.encode()).digest()
        digests[principal] = digest
    return digests


class WatchedFile(Generic[T]):
    """What `read` makes of a file, made again when the file changes. A file that becomes
    unusable (`read` raises `unusable`) keeps what was read before, and the log says why once
    per change."""

    def __init__(self, path: Path, read: Callable[[Path], T], unusable: type[Exception]) -> None:
        """Raises `unusable`: a server does not start with a file it cannot use."""
        self._path, self._read, self._unusable = path, read, unusable
        self._seen = self._version()
        self._value = read(path)

    def _version(self) -> tuple[int, int, int] | None:
        try:
            info = self._path.stat()
        except OSError:
            return None
        return info.st_ino, info.st_mtime_ns, info.st_size

    def current(self) -> T:
        version = self._version()
        if version != self._seen:
            self._seen = version
            try:
                self._value = self._read(self._path)
            except self._unusable as error:
                logger.warning("%s; what was read before stays", error)
        return self._value


class TokenTable:
    """The principals of a tokens file, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        """Raises TokensFileError: a server does not start with a file it cannot use."""
        self._file = WatchedFile(path, _digests, TokensFileError)

    def principal(self, token: str) -> str | None:
        """Whose token this is, or None."""
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for principal, expected in self._file.current().items():
            # Every entry is compared: the time taken says nothing about which one matched.
            if hmac.compare_digest(digest, expected):
                found = principal
        return found


class Caller(AccessToken):
    """A bearer token this server accepted, and the principal it names."""

    principal: str


class Verifier(Protocol):
    """The SDK's TokenVerifier, answering a Caller: a token it cannot check is None, never raised."""

    async def verify_token(self, token: str) -> Caller | None: ...


class StaticTokens:
    """The tokens an operator hands out: MCP_SANDBOX_AUTH_TOKEN (the sole principal) and the
    tokens file's principals."""

    def __init__(self, single: str | None, table: TokenTable | None) -> None:
        self._single = hashlib.sha256(single.encode()).digest() if single is not None else None
        self._table = table

    async def verify_token(self, token: str) -> Caller | None:
        principal = None
        if self._single is not None and hmac.compare_digest(
            hashlib.sha256(token.encode()).digest(), self._single
        ):
            principal = SOLE
        elif self._table is not None:
            principal = self._table.principal(token)
        if principal is None:
            return None
        return Caller(token=token, client_id=principal, scopes=[], principal=principal)


class FirstOf:
    """The first verifier's Caller that accepts a token."""

    def __init__(self, verifiers: Sequence[Verifier]) -> None:
        self._verifiers = verifiers

    async def verify_token(self, token: str) -> Caller | None:
        for verifier in self._verifiers:
            caller = await verifier.verify_token(token)
            if caller is not None:
                return caller
        return None
