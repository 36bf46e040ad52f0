"""Keel: a durable, auditable, resumable harness for LLM agents."""

from keel.core.budget import Budget
from keel.core.errors import KeelError
from keel.core.events import Event, EventType
from keel.core.status import RunStatus

__all__ = ["Budget", "Event", "EventType", "KeelError", "RunStatus"]
