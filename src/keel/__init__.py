"""Keel: a durable, auditable, resumable harness for LLM agents.

The public names are loaded on first use (PEP 562 ``__getattr__``): importing any
``keel.*`` module imports this package first, and ``Harness`` pulls in the whole
runtime (the loop, the tools, the models, httpx, OTel...), which every ``keel``
command would otherwise pay at start-up, ``keel --help`` and ``keel stats`` too.
"""

# Private aliases: the package's namespace holds its public names only.
import typing as _typing

from keel.lazy_names import lazy_names as _lazy_names

if _typing.TYPE_CHECKING:
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

# public name -> the module that defines it
_WHERE = {
    "AsyncHarness": "keel.runtime.async_harness",
    "Budget": "keel.core.budget",
    "Event": "keel.core.events",
    "EventType": "keel.core.events",
    "Harness": "keel.runtime.harness",
    "KeelError": "keel.core.errors",
    "RunOutcome": "keel.runtime.harness",
    "RunState": "keel.core.state",
    "RunStatus": "keel.core.status",
    "Store": "keel.store.base",
    "Task": "keel.core.tasks",
    "TaskStatus": "keel.core.tasks",
    "open_store": "keel.store.url",
}

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


if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no other name
    __getattr__, __dir__ = _lazy_names(globals(), _WHERE)
