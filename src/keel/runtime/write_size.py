"""The write-size guard: a ``before_tool`` middleware that refuses an oversized write.

Enabled by ``[write_size] max_bytes`` in ``.keel/hooks.toml`` (or given to
``Harness(middleware=[WriteSizeGuard(max_bytes=N)])``). It measures what the model
asks to write — ``write_file``'s ``content``, ``edit_file``'s ``new_text`` — as UTF-8
bytes and denies a call over the limit before anything is written; the model is told
the size and the limit, so it can write the file in parts or reconsider.
"""

from __future__ import annotations

from typing import Final

from keel.core.middleware import CONTINUE, Decision, Deny
from keel.loop.middleware import Middleware, ToolCallContext

MEASURED: Final = {"write_file": "content", "edit_file": "new_text"}


class WriteSizeGuard(Middleware):
    """Deny ``write_file``/``edit_file`` calls whose text is over ``max_bytes``."""

    name = "write_size"

    def __init__(self, *, max_bytes: int, order: int = -100) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError("max_bytes is a whole number of bytes, 1 or more")
        self.max_bytes = max_bytes
        self.order = order  # early: nothing later should see a call that will be denied

    def before_tool(self, ctx: ToolCallContext) -> Decision:
        field = MEASURED.get(ctx.tool)
        text = ctx.arguments.get(field) if field else None
        if not isinstance(text, str):
            return CONTINUE
        size = len(text.encode("utf-8", "surrogatepass"))
        if size <= self.max_bytes:
            return CONTINUE
        path = ctx.arguments.get("path", "?")
        return Deny(
            reason=f"{ctx.tool} of {size} bytes to {path} is over the {self.max_bytes}-byte "
            "limit on one write"
        )


__all__ = ["WriteSizeGuard"]
