"""Turn a model spec string (``--model`` / ``KEEL_MODEL``) into a `Model`.

Accepted specs: ``deepseek:MODEL``, ``openai:MODEL``, ``scripted:PATH`` (relative to the
working directory). Settings come from the environment overlaid on the working
directory's ``.env`` (a variable already set wins); ``os.environ`` itself is not changed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from dotenv import dotenv_values

from keel.core.errors import ConfigError
from keel.models.base import Model
from keel.models.openai_compat import OpenAICompatModel
from keel.models.pricing import load_price_table
from keel.models.scripted import ScriptedModel

ACCEPTED_FORMS = (
    "deepseek:MODEL (e.g. deepseek:deepseek-chat), openai:MODEL (e.g. openai:gpt-4o-mini; "
    "any OpenAI-compatible server via OPENAI_BASE_URL) or scripted:PATH (a JSON script)"
)


@dataclass(frozen=True, kw_only=True)
class Provider:
    """Where an OpenAI-compatible provider lives and which variables configure it."""

    key_variable: str
    base_url_variable: str
    default_base_url: str


_Number = TypeVar("_Number", int, float)

PROVIDERS: Mapping[str, Provider] = {
    "deepseek": Provider(
        key_variable="DEEPSEEK_API_KEY",
        base_url_variable="DEEPSEEK_BASE_URL",
        default_base_url="https://api.deepseek.com",
    ),
    "openai": Provider(
        key_variable="OPENAI_API_KEY",
        base_url_variable="OPENAI_BASE_URL",
        default_base_url="https://api.openai.com/v1",
    ),
}


def read_environment(cwd: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: the process environment) overlaid on ``cwd/.env``."""
    env_file = cwd / ".env"
    from_file: dict[str, str] = {}
    if env_file.is_file():
        from_file = {k: v for k, v in dotenv_values(env_file).items() if v is not None}
    return {**from_file, **(os.environ if environ is None else environ)}


def resolve_model(spec: str, *, cwd: Path, environ: Mapping[str, str] | None = None) -> Model:
    """The model `spec` names, configured from the environment and ``cwd/.env``.

    Retry settings may be overridden by KEEL_MODEL_MAX_ATTEMPTS, KEEL_MODEL_MAX_WAIT
    (seconds of backoff in total) and KEEL_MODEL_TIMEOUT (seconds per network operation).
    Raises `ConfigError` for a malformed spec, an unknown provider, a missing API key
    (naming the variable to set) or a bad setting.
    """
    provider, sep, rest = spec.partition(":")
    provider = provider.strip()
    rest = rest.strip()
    if not sep or not provider or not rest:
        raise ConfigError(f"malformed model spec {spec!r}: expected {ACCEPTED_FORMS}")
    if provider == "scripted":
        path = Path(rest).expanduser()
        return ScriptedModel.from_file(path if path.is_absolute() else cwd / path, spec=spec)
    settings = PROVIDERS.get(provider)
    if settings is None:
        raise ConfigError(
            f"unknown model provider {provider!r} in {spec!r}: expected {ACCEPTED_FORMS}"
        )
    env = read_environment(cwd, environ)
    api_key = env.get(settings.key_variable, "").strip()
    if not api_key:
        local_hint = (
            "; a local server that needs no key accepts any value" if provider == "openai" else ""
        )
        raise ConfigError(
            f"model {spec} needs an API key: set {settings.key_variable} "
            f"(in the environment or .env){local_hint}"
        )
    return OpenAICompatModel(
        spec=f"{provider}:{rest}",
        model=rest,
        base_url=env.get(settings.base_url_variable, "").strip() or settings.default_base_url,
        api_key=api_key,
        prices=load_price_table(cwd),
        max_attempts=_setting(env, "KEEL_MODEL_MAX_ATTEMPTS", int, 5, minimum=1),
        max_wait=_setting(env, "KEEL_MODEL_MAX_WAIT", float, 60.0, minimum=0),
        timeout=_setting(env, "KEEL_MODEL_TIMEOUT", float, 120.0, minimum=0.001),
        api_key_variable=settings.key_variable,
    )


def _setting(
    env: Mapping[str, str], name: str, kind: type[_Number], default: _Number, *, minimum: float
) -> _Number:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name}={raw!r} must be a finite number")
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum:g}")
    return value
