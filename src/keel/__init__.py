"""Keel: a durable, auditable, resumable harness for LLM agents."""

from keel.core.budget import Budget
from keel.core.errors import KeelError
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.tasks import Task, TaskStatus
from keel.runtime.async_harness import AsyncHarness
from keel.runtime.harness import Harness, RunOutcome
from keel.store.base import Store
from keel.store.url import open_store

__all__ = [
    "AsyncHarness",
    "Budget",
    "Event",
    "EventType",
    "Harness",
    "KeelError",
    "RunOutcome",
    "RunState",
    "RunStatus",
    "Store",
    "Task",
    "TaskStatus",
    "open_store",
]
