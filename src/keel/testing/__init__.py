"""Public test helpers: fakes at Keel's boundaries, never of its machinery."""

from keel.models.scripted import ScriptedModel
from keel.testing.provider import FakeProvider

__all__ = ["FakeProvider", "ScriptedModel"]
