"""A tool described by a JSON Schema instead of a Python signature (an MCP server's).

Its arguments are checked against the schema (Draft 2020-12) before anything runs, so a
call the server would refuse is a ``ToolArgumentError`` the model can correct, exactly
as for a built-in; the schema itself is what the model is offered. A schema that is not
a valid JSON Schema object is refused when the tool is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict

from keel.core.errors import ToolArgumentError, UsageError
from keel.tools.base import Tool, ToolContext, ToolResult, ToolSchema

MAX_PROBLEMS = 5


class SchemaArguments(BaseModel):
    """Arguments already checked against the tool's schema, kept as sent."""

    model_config = ConfigDict(extra="allow", frozen=True)


SchemaFunction = Callable[[ToolContext, dict[str, Any]], ToolResult]


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaTool(Tool):
    """``Tool`` whose argument model is ``input_schema``; ``call`` gets them as a dict."""

    input_schema: dict[str, Any]
    call: SchemaFunction

    def __post_init__(self) -> None:
        if self.input_schema.get("type", "object") != "object":
            raise UsageError(f"tool {self.name}: its input schema must describe an object")
        try:
            Draft202012Validator.check_schema(self.input_schema)
        except jsonschema.SchemaError as exc:
            raise UsageError(f"tool {self.name}: invalid input schema: {exc.message}") from None

    def spec(self) -> ToolSchema:
        schema = dict(self.input_schema)
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        return {"name": self.name, "description": self.description, "parameters": schema}

    def _parse_arguments(self, raw: str | Mapping[str, Any] | BaseModel | None) -> BaseModel:
        if isinstance(raw, SchemaArguments):
            return raw
        parsed = Tool._parse_arguments(self, raw)  # JSON text, an object: or a precise error
        values = parsed.model_dump()
        validator = Draft202012Validator(self.input_schema)
        problems = [
            f"{'/'.join(str(p) for p in error.absolute_path) or '(arguments)'}: {error.message}"
            for error in sorted(validator.iter_errors(values), key=lambda e: list(e.path))
        ]
        if problems:
            shown = problems[:MAX_PROBLEMS]
            raise ToolArgumentError(
                self.name,
                f"invalid arguments for {self.name}: " + "; ".join(shown),
                tuple(shown),
            )
        return SchemaArguments(**values)

    def run(self, ctx: ToolContext, args: str | Mapping[str, Any] | BaseModel) -> ToolResult:
        return self.call(ctx, self.parse_arguments(args).model_dump())


def schema_tool(
    *,
    name: str,
    description: str,
    input_schema: dict[str, Any],
    call: SchemaFunction,
    **declared: Any,
) -> SchemaTool:
    """A ``SchemaTool`` (``declared``: effect, recovery, time_limit_s as for ``Tool``)."""
    return SchemaTool(
        name=name,
        description=description,
        args_model=SchemaArguments,
        input_schema=input_schema,
        call=call,
        **declared,
    )
