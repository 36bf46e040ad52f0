"""The hash chain that makes a run's event log tamper-evident (pure: no I/O).

Every stored event carries ``hash``, the hex sha256 of::

    prev + "\\n" + header + "\\n" + data

``prev`` is the previous event's hash; the first event chains to ``genesis(run_id)``.
``header`` is the canonical JSON array ``[run_id, seq, event_id, type, recorded_at]``
(``separators=(",", ":")``, non-ASCII kept) with ``recorded_at`` written by
``chain_time``; ``data`` is the event's data exactly as stored: the JSON text its
writer produced. Changing, inserting, removing or reordering an event therefore
changes the hash of every event from there on, and the run records the hash of its
last event (its *head*) beside the log.

What this proves: the log is the one its writers appended, unless someone rewrote
every hash from the change onwards and the run's head too. The chain is not keyed
(anyone who can write the database can recompute it), so an external copy of a
run's head hash (``keel verify`` prints it) is what pins a log against that.

``ChainCheck`` walks stored rows in sequence order and raises ``LogDamaged`` naming
the first event that is missing, out of place, beyond the run's head or not what
its hash says.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Final

from keel.core.errors import LogDamaged

GENESIS_TAG: Final = "keel event chain v1\n"
_ESCAPED: Final = re.compile(r'["\\\x00-\x1f]')  # what canonical JSON would escape
_sha256 = hashlib.sha256


def genesis(run_id: str) -> str:
    """The hash the first event of ``run_id`` chains to (fixed, derived from the id)."""
    return _sha256((GENESIS_TAG + run_id).encode("utf-8", "surrogatepass")).hexdigest()


def chain_time(moment: datetime) -> str:
    """``recorded_at`` as the chain hashes it: fixed-width ISO-8601 UTC, microseconds.

    Equal to what the SQLite store writes (``2026-12-01T02:11:54.000123+00:00``).
    """
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="microseconds")


def event_hash(
    prev: str,
    run_id: str,
    seq: int,
    event_id: str,
    type_: str,
    recorded_at: str,
    data: str,
) -> str:
    """The hash of one event given the previous event's hash (see the module docstring)."""
    if _ESCAPED.search(run_id + event_id + type_ + recorded_at) is None:
        header = f'["{run_id}",{seq},"{event_id}","{type_}","{recorded_at}"]'
    else:  # only a tampered row has such characters: take the slow, exact path
        header = json.dumps(
            [run_id, seq, event_id, type_, recorded_at], separators=(",", ":"), ensure_ascii=False
        )
    text = f"{prev}\n{header}\n{data}"
    return _sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def plain(text: str) -> bool:
    """True when canonical JSON writes ``text`` as is (no quote, backslash or control)."""
    return _ESCAPED.search(text) is None


def plain_event_hash(
    prev: str,
    run_id: str,
    seq: int,
    event_id: str,
    type_: str,
    recorded_at: str,
    data: str,
) -> str:
    """``event_hash`` for a writer whose fields are all ``plain`` (it made them: a hex id,
    a registry type, ``chain_time`` text): the same hash, without checking them."""
    text = f'{prev}\n["{run_id}",{seq},"{event_id}","{type_}","{recorded_at}"]\n{data}'
    return _sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class ChainCheck:
    """Checks one run's stored events, fed in sequence order, against the chain.

    ``after``/``prev``: the rows start after event ``after`` whose hash is ``prev``
    (``0`` and the genesis hash for a whole log). ``head_seq`` is the run's last
    sequence as the run records it. ``expect`` pins the hash that one sequence must
    have (the snapshot's). Each ``row`` raises ``LogDamaged`` at the first problem;
    ``end`` checks that the rows reached the run's head and its recorded hash.
    """

    __slots__ = ("expect", "hash", "head_seq", "run_id", "seq")

    def __init__(
        self,
        run_id: str,
        *,
        head_seq: int,
        after: int = 0,
        prev: str | None = None,
        expect: tuple[int, str | None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.head_seq = head_seq
        self.expect = expect
        self.seq = after  # the last event checked
        self.hash = genesis(run_id) if prev is None else prev

    def damaged(self, seq: int, detail: str) -> LogDamaged:
        return LogDamaged(self.run_id, seq, detail)

    def row(
        self,
        seq: int,
        event_id: str,
        type_: str,
        recorded_at: str,
        data: str,
        stored: str | None,
    ) -> str:
        """Check the next stored row; return its hash."""
        expected = self.seq + 1
        if seq != expected:
            if expected > self.head_seq:
                raise self.damaged(seq, self._beyond())
            raise self.damaged(expected, f"missing (the next stored event is seq {seq})")
        if seq > self.head_seq:
            raise self.damaged(seq, self._beyond())
        if stored is None:
            raise self.damaged(seq, "it has no hash")
        computed = event_hash(self.hash, self.run_id, seq, event_id, type_, recorded_at, data)
        if computed != stored:
            raise self.damaged(
                seq, "its content does not match its hash (changed after it was written)"
            )
        if self.expect is not None and self.expect[0] == seq and self.expect[1] != computed:
            raise self.damaged(seq, "the run's snapshot does not match this event")
        self.seq, self.hash = seq, computed
        return computed

    def _beyond(self) -> str:
        return f"not appended by Keel (the run's last event is seq {self.head_seq})"

    def end(self, head_hash: str | None) -> None:
        """The rows are all there were: they must end at the run's head, with its hash."""
        if self.seq < self.head_seq:
            raise self.damaged(
                self.seq + 1, f"missing (the run's last event is seq {self.head_seq})"
            )
        if head_hash != self.hash:
            raise self.damaged(
                self.head_seq, "the run's recorded chain head does not match this event"
            )


__all__ = [
    "GENESIS_TAG",
    "ChainCheck",
    "chain_time",
    "event_hash",
    "genesis",
    "plain",
    "plain_event_hash",
]
