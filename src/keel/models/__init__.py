"""Models: the `Model` protocol, the OpenAI-compatible adapter and the scripted model.

The names are loaded on first use (PEP 562 ``__getattr__``): importing
``keel.models.base`` (the protocol, which the CLI's views use) must not load the
adapters, pydantic and the HTTP client at every ``keel`` start.
"""

# Private aliases: the package's namespace holds its public names only.
import typing as _typing

from keel.lazy_names import lazy_names as _lazy_names

if _typing.TYPE_CHECKING:
    from keel.models.base import (
        FinishReason,
        Message,
        Model,
        ModelRequest,
        ModelTurn,
        RetryNotice,
        StreamDelta,
        TokenUsage,
        ToolCall,
        ToolSpec,
        price_known,
    )
    from keel.models.connections import close_shared_clients, shared_client
    from keel.models.openai_compat import OpenAICompatModel
    from keel.models.pricing import Price, PriceTable, load_price_table
    from keel.models.profiles import ProviderProfile, profile_for
    from keel.models.resolve import read_environment, resolve_model
    from keel.models.scripted import ScriptedModel

# public name -> the module that defines it
_WHERE = {
    "FinishReason": "keel.models.base",
    "Message": "keel.models.base",
    "Model": "keel.models.base",
    "ModelRequest": "keel.models.base",
    "ModelTurn": "keel.models.base",
    "OpenAICompatModel": "keel.models.openai_compat",
    "Price": "keel.models.pricing",
    "PriceTable": "keel.models.pricing",
    "ProviderProfile": "keel.models.profiles",
    "RetryNotice": "keel.models.base",
    "ScriptedModel": "keel.models.scripted",
    "StreamDelta": "keel.models.base",
    "TokenUsage": "keel.models.base",
    "ToolCall": "keel.models.base",
    "ToolSpec": "keel.models.base",
    "close_shared_clients": "keel.models.connections",
    "load_price_table": "keel.models.pricing",
    "price_known": "keel.models.base",
    "profile_for": "keel.models.profiles",
    "read_environment": "keel.models.resolve",
    "resolve_model": "keel.models.resolve",
    "shared_client": "keel.models.connections",
}

__all__ = [
    "FinishReason",
    "Message",
    "Model",
    "ModelRequest",
    "ModelTurn",
    "OpenAICompatModel",
    "Price",
    "PriceTable",
    "ProviderProfile",
    "RetryNotice",
    "ScriptedModel",
    "StreamDelta",
    "TokenUsage",
    "ToolCall",
    "ToolSpec",
    "close_shared_clients",
    "load_price_table",
    "price_known",
    "profile_for",
    "read_environment",
    "resolve_model",
    "shared_client",
]


if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no other name
    __getattr__, __dir__ = _lazy_names(globals(), _WHERE)
