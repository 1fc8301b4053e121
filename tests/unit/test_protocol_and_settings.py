from __future__ import annotations

import base64
import json

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mcp_sandbox.app import check_request
from mcp_sandbox.backends.channel import Sealer
from mcp_sandbox.errors import InvalidRequest
from mcp_sandbox.protocol import (
    HOST_LINE_NONCE_BYTES,
    cap_text,
    encode,
    host_line_key,
    max_line_bytes,
    open_envelope,
)
from mcp_sandbox.result import cap_outcome
from mcp_sandbox.settings import Settings
from tests.unit.fakes import outcome


def test_envelope_with_the_right_token_is_opened() -> None:
    # Runners write the envelope compactly, as envelope_prefix spells it.
    line = json.dumps({"token": "abc", "msg": {"type": "ready"}}, separators=(",", ":")).encode()
    assert open_envelope(line, "abc") == {"type": "ready"}


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({"token": "wrong", "msg": {"type": "ready"}}).encode(),
        json.dumps({"msg": {"type": "ready"}}).encode(),
        json.dumps({"token": "abc", "msg": "ready"}).encode(),
    ],
)
def test_forged_or_malformed_lines_are_refused(line: bytes) -> None:
    assert open_envelope(line, "abc") is None


def test_encode_is_one_line() -> None:
    encoded = encode({"type": "run", "id": 1, "code": "print('a')\nprint('b')"})
    assert encoded.endswith(b"\n") and encoded.count(b"\n") == 1


def unseal(sealed: bytes, token: str) -> bytes:
    """What runner.ts does with a sealed host line."""
    raw = base64.b64decode(sealed.rstrip(b"\n"), validate=True)
    nonce = raw[:HOST_LINE_NONCE_BYTES]
    return AESGCM(host_line_key(token)).decrypt(nonce, raw[HOST_LINE_NONCE_BYTES:], None)


def test_a_sealed_host_line_is_one_line_that_opens_with_its_token_only() -> None:
    line = encode({"type": "run", "id": 1, "code": "secret = 42\nprint(secret)"}, 3)
    sealer = Sealer("abc")
    first, second = sealer.seal(line), sealer.seal(line)
    assert first.endswith(b"\n") and first.count(b"\n") == 1
    assert b"secret" not in base64.b64decode(first)
    assert first != second, "the same line sealed twice must differ (a nonce per line)"
    assert unseal(first, "abc") == unseal(second, "abc") == line.rstrip(b"\n")
    with pytest.raises(InvalidTag):
        unseal(first, "abd")


def test_max_line_allows_a_full_result() -> None:
    assert max_line_bytes(32_768) > 4 * 6 * 32_768


def test_outcome_from_the_guest_is_capped_again_on_the_host() -> None:
    forged = outcome(stdout="x" * 10_000, result="y" * 10_000)
    capped = cap_outcome(forged, 1000)
    assert capped["truncated"] and len(capped["stdout"]) < 1100 and len(capped["result"] or "") < 1100
    assert capped["stdout"] == cap_text("x" * 10_000, 1000)[0]
    honest = outcome(stdout="fine")
    assert cap_outcome(honest, 1000) == honest


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_SANDBOX_TIMEOUT", "12")
    monkeypatch.setenv("MCP_SANDBOX_POOL_SIZE", "5")
    settings = Settings()
    assert settings.timeout == 12 and settings.pool_size == 5


def test_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_SANDBOX_TIMEOUT", "-3")
    with pytest.raises(ValueError):
        Settings()


def test_timeout_defaults_and_is_clamped() -> None:
    settings = Settings(timeout=30, max_timeout=60)
    assert settings.clamp_timeout(None) == 30
    assert settings.clamp_timeout(5) == 5
    assert settings.clamp_timeout(10_000) == 60


def test_every_setting_is_documented_in_env_example() -> None:
    from pathlib import Path

    documented = (Path(__file__).resolve().parents[2] / ".env.example").read_text()
    missing = [name for name in Settings.model_fields if f"MCP_SANDBOX_{name.upper()}=" not in documented]
    assert missing == []


def test_a_line_nested_thousands_deep_is_refused_not_raised() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert open_envelope(deep, "abc") is None, "forged: refused before parsing"
    genuine_prefix = json.dumps({"token": "abc", "msg": 1}, separators=(",", ":"))[: -len("1}")].encode()
    assert open_envelope(genuine_prefix + deep + b"}", "abc") is None


@pytest.mark.parametrize("session_id", ["ok\n", "..", "with space", "x" * 129])
def test_a_session_id_must_match_whole(session_id: str) -> None:
    with pytest.raises(InvalidRequest, match="session_id"):
        check_request(Settings(), "1", session_id, None)


def test_the_default_packages_are_what_people_expect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCP_SANDBOX_DEFAULT_PACKAGES", raising=False)  # tests turn them off
    settings = Settings(_env_file=None)
    assert settings.default_package_names == ["numpy", "pandas", "matplotlib"]
    assert settings.package_index_url is None, "None: the Pyodide CDN for the pinned version"
    assert Settings(default_packages=" numpy , pandas,").default_package_names == ["numpy", "pandas"]
    assert Settings(default_packages="").default_package_names == []


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("default_packages", "numpy,../evil"),
        ("default_packages", "a b"),
        ("package_index_url", "ftp://mirror/"),
    ],
)
def test_bad_package_settings_are_refused(setting: str, value: str) -> None:
    with pytest.raises(ValueError, match=setting):
        Settings(**{setting: value})


def test_the_index_url_is_a_folder() -> None:
    assert Settings(package_index_url="http://mirror/pyodide").package_index_url == "http://mirror/pyodide/"
