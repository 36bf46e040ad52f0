"""Everything a middleware author imports, in one place.

    from keel.middleware import CONTINUE, Ask, Deny, Middleware, ToolCallContext

The decisions are data (``keel.core.middleware``); the base class, the point contexts
and the chain live with the loop (``keel.loop.middleware``); the built-in write-size
guard is ``WriteSizeGuard``.
"""

from keel.core.middleware import (
    CONTINUE,
    Append,
    Ask,
    Continue,
    Decision,
    Deny,
    Modify,
    Point,
    ShortCircuit,
)
from keel.loop.middleware import (
    CompletionContext,
    Middleware,
    ModelContext,
    ToolCallContext,
    ToolResultContext,
    TurnContext,
)
from keel.runtime.write_size import WriteSizeGuard

__all__ = [
    "CONTINUE",
    "Append",
    "Ask",
    "CompletionContext",
    "Continue",
    "Decision",
    "Deny",
    "Middleware",
    "ModelContext",
    "Modify",
    "Point",
    "ShortCircuit",
    "ToolCallContext",
    "ToolResultContext",
    "TurnContext",
    "WriteSizeGuard",
]
