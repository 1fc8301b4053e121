"""Principals: the tokens file, its checks, and its re-reading."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from mcp_sandbox.principals import SOLE, TokensFileError, TokenTable, scoped


def tokens_file(path: Path, table: object, mode: int = 0o600) -> Path:
    path.write_text(json.dumps(table), encoding="utf-8")
    path.chmod(mode)
    return path


def test_a_token_or_its_hash_names_its_principal(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"bob-secret").hexdigest()
    table = TokenTable(tokens_file(tmp_path / "t.json", {"alice": "alice-secret", "bob": f"sha256:{digest}"}))
    assert table.principal("alice-secret") == "alice"
    assert table.principal("bob-secret") == "bob"
    assert table.principal(f"sha256:{digest}") is None, "the hash is not itself a token"
    assert table.principal("") is None


@pytest.mark.parametrize(
    ("table", "mode", "says"),
    [
        ({"alice": "a-secret"}, 0o640, "readable by its owner only"),
        ([], 0o600, "must be a JSON object"),
        ({"../up": "a-secret"}, 0o600, "is not a principal's name"),
        ({"alice": ""}, 0o600, "needs a token"),
        ({"alice": "sha256:abc"}, 0o600, "not 64 hex digits"),
    ],
)
def test_a_file_that_cannot_be_used_is_refused_saying_why(
    tmp_path: Path, table: object, mode: int, says: str
) -> None:
    with pytest.raises(TokensFileError, match=says):
        TokenTable(tokens_file(tmp_path / "t.json", table, mode))


def test_a_change_is_read_and_a_broken_file_keeps_the_principals_it_had(tmp_path: Path) -> None:
    path = tokens_file(tmp_path / "t.json", {"alice": "alice-secret"})
    table = TokenTable(path)
    tokens_file(path, {"alice": "alice-secret", "carol": "carol-secret-longer"})
    assert table.principal("carol-secret-longer") == "carol"
    path.write_text("{broken", encoding="utf-8")
    os.utime(path, ns=(1, 1))
    assert table.principal("carol-secret-longer") == "carol"


def test_two_principals_never_share_a_session_name() -> None:
    assert scoped(SOLE, "analysis") == "analysis"
    assert scoped("alice", "analysis") != scoped("bob", "analysis")
