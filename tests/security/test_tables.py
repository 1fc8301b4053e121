"""The attack tables together: every attack named once, with distinct programs, on every backend."""

from __future__ import annotations

from tests.security import (
    test_host_folders,
    test_host_secrets,
    test_javascript,
    test_network,
    test_processes,
    test_protocol,
    test_resources,
    test_sessions,
)
from tests.security.harness import BACKENDS, POISON_TARGETS, Attack

#: Every table, in one list (tests/security/test_recycling.py runs the taint checks among them again).
ATTACKS: list[Attack] = [
    *test_host_folders.ATTACKS,
    *test_host_secrets.ATTACKS,
    *test_javascript.ATTACKS,
    *test_network.ATTACKS,
    *test_processes.ATTACKS,
    *test_protocol.ATTACKS,
    *test_resources.ATTACKS,
    *test_sessions.ATTACKS,
]


def test_the_table_is_big_and_distinct() -> None:
    names = [attack.name for attack in ATTACKS]
    assert len(names) == len(set(names)), "attack names must be distinct"
    assert len({attack.code for attack in ATTACKS}) == len(ATTACKS), "attack programs must be distinct"
    assert len(ATTACKS) >= 50
    # A target that no longer exists would make the poisoning attack prove nothing.
    assert all(path.is_file() for path in POISON_TARGETS[:3]), POISON_TARGETS
    for attack in ATTACKS:
        assert set(attack.expected) == set(BACKENDS), attack.name
