"""Models: the `Model` protocol, the OpenAI-compatible adapter and the scripted model."""

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
