"""Owners and tokens: hashed at rest, shown once, authenticated by hash."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import tokens
from services.jobdb.models import ApiToken


def test_token_authenticates_its_owner_and_is_stored_hashed(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        alice, alice_token = tokens.create_owner_with_token(session, "alice")
        bob, bob_token = tokens.create_owner_with_token(session, "bob", admin=True)
    assert alice_token != bob_token and alice_token.startswith(tokens.TOKEN_PREFIX)
    with session_factory() as session:
        found = tokens.authenticate(session, alice_token)
        assert found is not None and found.id == alice.id and not found.is_admin
        admin = tokens.authenticate(session, bob_token)
        assert admin is not None and admin.id == bob.id and admin.is_admin
        rows = session.scalars(select(ApiToken)).all()
    stored = {row.token_hash for row in rows} | {row.prefix for row in rows}
    assert alice_token not in stored and bob_token not in stored
    assert {row.token_hash for row in rows} == {
        tokens.hash_token(alice_token),
        tokens.hash_token(bob_token),
    }
    assert {row.prefix for row in rows} == {alice_token[:12], bob_token[:12]}


@pytest.mark.parametrize("presented", ["", "accum_wrong", "Bearer x"])
def test_unknown_tokens_are_refused(session_factory: sessionmaker[Session], presented: str) -> None:
    with session_factory.begin() as session:
        tokens.create_owner_with_token(session, "alice")
    with session_factory() as session:
        assert tokens.authenticate(session, presented) is None


def test_same_name_gets_another_token_for_the_same_owner(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        first, token_1 = tokens.create_owner_with_token(session, "carol")
        second, token_2 = tokens.create_owner_with_token(session, "carol", admin=True)
    assert first.id == second.id and token_1 != token_2
    with session_factory() as session:
        for token in (token_1, token_2):
            owner = tokens.authenticate(session, token)
            assert owner is not None and owner.id == first.id and owner.is_admin


def test_empty_owner_name_is_refused(session_factory: sessionmaker[Session]) -> None:
    with session_factory.begin() as session, pytest.raises(ValueError, match="accum token create"):
        tokens.create_owner_with_token(session, "  ")


def test_revoke_by_prefix_or_whole_token_and_list_shows_prefixes_only(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        _, first = tokens.create_owner_with_token(session, "dora")
        _, second = tokens.create_owner_with_token(session, "dora")
        tokens.create_owner_with_token(session, "eve")
    with session_factory.begin() as session:
        assert [row[:2] for row in tokens.list_tokens(session, "dora")] == [
            ("dora", first[:12]),
            ("dora", second[:12]),
        ]
        assert tokens.revoke_token(session, first[:12]) == 1
        assert tokens.revoke_token(session, second) == 1
        assert tokens.revoke_token(session, second) == 0  # already gone
    with session_factory() as session:
        assert tokens.authenticate(session, first) is None
        assert tokens.authenticate(session, second) is None
        assert [row[0] for row in tokens.list_tokens(session)] == ["eve"]
        # Revoked, not deleted: the audit trail keeps who had which token and until when.
        trail = tokens.list_tokens(session, "dora", include_revoked=True)
        assert [(name, prefix) for name, prefix, _, _, _ in trail] == [("dora", first[:12]), ("dora", second[:12])]
        assert all(revoked is not None and revoked >= created for _, _, created, revoked, _ in trail)


def test_a_revoked_token_with_the_same_prefix_does_not_block_revoking_the_live_one(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        owner, token = tokens.create_owner_with_token(session, "dora")
        session.add(ApiToken(owner_id=owner.id, token_hash="0" * 64, prefix=token[:12]))
    with session_factory.begin() as session:
        assert tokens.revoke_token(session, token) == 1
    with session_factory.begin() as session:  # the other one is now the only live match
        assert tokens.revoke_token(session, token[:12]) == 1
        assert tokens.revoke_token(session, token[:12]) == 0


def test_a_prefix_shared_by_two_tokens_is_refused(session_factory: sessionmaker[Session]) -> None:
    with session_factory.begin() as session:
        owner, token = tokens.create_owner_with_token(session, "dora")
        # A second token with the same display prefix (rare, but 6 random characters can clash).
        session.add(ApiToken(owner_id=owner.id, token_hash="0" * 64, prefix=token[:12]))
    with session_factory.begin() as session, pytest.raises(ValueError, match="matches 2 tokens"):
        tokens.revoke_token(session, token[:12])
    with session_factory.begin() as session:
        assert tokens.revoke_token(session, token) == 1
    with session_factory.begin() as session, pytest.raises(ValueError, match="12-character prefix"):
        tokens.revoke_token(session, "accum_")


def test_authenticating_records_when_the_token_was_last_used_at_most_once_a_minute(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        tokens.create_owner_with_token(session, "alice")
        _, unused = tokens.create_owner_with_token(session, "bob")
    with session_factory.begin() as session:
        _, token = tokens.create_owner_with_token(session, "alice")

    def last_used() -> dict[str, object]:
        with session_factory() as session:
            return {prefix: used for _, prefix, _, _, used in tokens.list_tokens(session)}

    assert set(last_used().values()) == {None}  # never presented
    with session_factory() as session:
        assert tokens.authenticate(session, token) is not None
        assert session.info.pop(tokens.TOUCHED) is True  # the caller commits it
        session.commit()
    first = last_used()[token[:12]]
    assert first is not None and last_used()[unused[:12]] is None

    with session_factory() as session:  # again within the minute: nothing to write
        assert tokens.authenticate(session, token) is not None
        assert tokens.TOUCHED not in session.info
    assert last_used()[token[:12]] == first


def test_owner_names_are_letters_digits_dot_underscore_dash(
    session_factory: sessionmaker[Session],
) -> None:
    for bad in ("a\nb", "two words", "x" * 65, "semi;colon", "ünï"):
        with session_factory() as session, pytest.raises(ValueError, match="1 to 64 letters"):
            tokens.create_owner_with_token(session, bad)
    with session_factory.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, "ok.name_1-" + "x" * 54)
        assert len(owner.name) == 64
