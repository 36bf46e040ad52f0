"""Models: the `Model` protocol, the OpenAI-compatible adapter and the scripted model."""

from keel.models.base import (
    Message,
    Model,
    ModelRequest,
    ModelTurn,
    RetryNotice,
    TokenUsage,
    ToolCall,
    ToolSpec,
)
from keel.models.openai_compat import OpenAICompatModel
from keel.models.pricing import Price, PriceTable, load_price_table
from keel.models.resolve import read_environment, resolve_model
from keel.models.scripted import ScriptedModel

__all__ = [
    "Message",
    "Model",
    "ModelRequest",
    "ModelTurn",
    "OpenAICompatModel",
    "Price",
    "PriceTable",
    "RetryNotice",
    "ScriptedModel",
    "TokenUsage",
    "ToolCall",
    "ToolSpec",
    "load_price_table",
    "read_environment",
    "resolve_model",
]
