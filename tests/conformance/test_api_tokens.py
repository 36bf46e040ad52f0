"""API tokens in the Store contract: kept by name with only the token's SHA-256, one live
token per name, revocation for good, lookups that see live tokens only."""

from __future__ import annotations

import hashlib
import secrets
import threading

import pytest

from keel.core.errors import NotFound, UsageError
from keel.store.base import ApiToken, Store
from keel.testing.stores import OutOfBand, reopened


def new_token() -> tuple[str, str]:
    """A token and its SHA-256 hex, as ``keel token create`` makes them."""
    token = "keel_" + secrets.token_urlsafe(32)
    return token, hashlib.sha256(token.encode()).hexdigest()


def test_a_created_token_is_found_by_its_hash_and_listed(store: Store) -> None:
    _, digest = new_token()
    made = store.create_token("ci-bot", digest)
    assert isinstance(made, ApiToken)
    assert (made.name, made.revoked_at, made.last_used_at) == ("ci-bot", None, None)
    assert made.created_at.tzinfo is not None
    assert store.token_by_hash(digest) == made
    assert store.list_tokens() == [made]
    with reopened(store) as other:  # another process sees it
        assert other.token_by_hash(digest) == made


def test_only_the_hash_is_stored_never_the_token(store: Store) -> None:
    token, digest = new_token()
    store.create_token("alice@laptop", digest)
    with OutOfBand(store) as db:
        rows = db.execute("SELECT * FROM api_tokens")
    assert len(rows) == 1
    stored = " ".join(str(value) for value in rows[0])
    assert digest in stored
    assert token not in stored and token[5:] not in stored


def test_a_token_instead_of_its_hash_is_refused_and_nothing_is_stored(store: Store) -> None:
    token, _ = new_token()
    for wrong in (token, "ABCDEF" * 10 + "ABCD", "0" * 63, ""):
        with pytest.raises(UsageError, match="SHA-256 as 64 lowercase hex"):
            store.create_token("ci", wrong)
    assert store.list_tokens() == []


def test_an_unknown_hash_finds_nothing(store: Store) -> None:
    store.create_token("ci", new_token()[1])
    assert store.token_by_hash(new_token()[1]) is None
    assert store.token_by_hash("not a hash") is None


def test_a_live_name_cannot_be_taken_twice_and_the_first_token_stays(store: Store) -> None:
    _, first = new_token()
    _, second = new_token()
    made = store.create_token("ci", first)
    with pytest.raises(UsageError) as refused:
        store.create_token("ci", second)
    assert str(refused.value) == "a token named ci already exists; revoke it first"
    assert store.list_tokens() == [made]
    assert store.token_by_hash(first) == made
    assert store.token_by_hash(second) is None


BAD_NAMES = ["", "a" * 65, "has space", "slash/no", "colon:no", "ümlaut", "tab\t", "new\nline"]


def test_a_name_breaking_the_rule_is_refused_naming_the_rule(store: Store) -> None:
    for name in BAD_NAMES:
        with pytest.raises(UsageError, match=r"1 to 64 characters from A-Z a-z 0-9 _ \. @ -"):
            store.create_token(name, new_token()[1])
    assert store.list_tokens() == []


def test_every_allowed_character_and_the_longest_name_are_accepted(store: Store) -> None:
    names = ["a" * 64, "A-z_0.9@host", "x"]
    for name in names:
        store.create_token(name, new_token()[1])
    assert sorted(t.name for t in store.list_tokens()) == sorted(names)


def test_revoking_stops_the_lookup_and_keeps_the_row_listed(store: Store) -> None:
    _, digest = new_token()
    made = store.create_token("ci", digest)
    revoked = store.revoke_token("ci")
    assert revoked.name == "ci" and revoked.created_at == made.created_at
    assert revoked.revoked_at is not None and revoked.revoked_at >= made.created_at
    assert store.token_by_hash(digest) is None
    assert store.list_tokens() == [revoked]


def test_revoking_an_unknown_or_revoked_name_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound) as unknown:
        store.revoke_token("nobody")
    assert str(unknown.value) == "no live token named nobody"
    store.create_token("ci", new_token()[1])
    first = store.revoke_token("ci")
    with pytest.raises(NotFound, match=r"^no live token named ci$"):
        store.revoke_token("ci")
    assert store.list_tokens() == [first]  # the second revoke changed nothing


def test_a_revoked_name_may_be_reused_and_replaces_the_old_row(store: Store) -> None:
    _, old = new_token()
    _, new = new_token()
    store.create_token("ci", old)
    store.revoke_token("ci")
    again = store.create_token("ci", new)
    assert again.revoked_at is None
    assert store.token_by_hash(new) == again
    assert store.token_by_hash(old) is None
    assert store.list_tokens() == [again]


def test_tokens_are_listed_oldest_first_revoked_ones_included(store: Store) -> None:
    for name in ("one", "two", "three"):
        store.create_token(name, new_token()[1])
    store.revoke_token("two")
    listed = store.list_tokens()
    assert [t.name for t in listed] == ["one", "two", "three"]
    assert [t.revoked_at is None for t in listed] == [True, False, True]
    assert [t.created_at for t in listed] == sorted(t.created_at for t in listed)


def test_concurrent_creators_of_one_name_leave_exactly_one_live_token(store: Store) -> None:
    digests = [new_token()[1] for _ in range(8)]
    won: list[str] = []
    refused: list[str] = []
    start = threading.Barrier(len(digests))

    def create(digest: str) -> None:
        start.wait()
        try:
            store.create_token("shared", digest)
            won.append(digest)
        except UsageError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=create, args=(d,)) for d in digests]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert refused == ["a token named shared already exists; revoke it first"] * 7
    assert [store.token_by_hash(d) is not None for d in digests].count(True) == 1
    assert store.token_by_hash(won[0]) is not None
    assert len(store.list_tokens()) == 1
