"""Public names of a package loaded on first use (PEP 562), for the packages every
``keel`` start imports (``keel``, ``keel.models``): importing them must not load the
runtime, the adapters or the HTTP client behind names the caller never touches."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    namespace: dict[str, Any], where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``. ``where`` maps each public name to
    the module that defines it; a name is imported the first time it is asked for and
    kept in ``namespace`` after (later look-ups are plain attribute reads). Any other
    name is an AttributeError, as for an ordinary module."""
    package = namespace["__name__"]

    def attribute(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(where))

    return attribute, names


__all__ = ["lazy_names"]
