"""Turn a model spec string (``--model`` / ``KEEL_MODEL``) into a `Model`.

Accepted specs: ``deepseek:MODEL``, ``openai:MODEL``, ``scripted:PATH`` and
``replay:PATH`` (paths relative to the working directory). Settings come from the
environment overlaid on the working directory's ``.env`` (a variable already set wins);
``os.environ`` itself is not changed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from dotenv import dotenv_values

from keel.core.errors import ConfigError
from keel.models.base import Model
from keel.models.openai_compat import MAX_ANSWER_SECONDS, OpenAICompatModel
from keel.models.pricing import load_price_table
from keel.models.profiles import profile_for
from keel.models.scripted import ScriptedModel

ACCEPTED_FORMS = (
    "deepseek:MODEL (e.g. deepseek:deepseek-chat), openai:MODEL (e.g. openai:gpt-4o-mini; "
    "any OpenAI-compatible server via OPENAI_BASE_URL), scripted:PATH (a JSON script) or "
    "replay:PATH (a cassette recorded with --record)"
)
STREAM_VARIABLE = "KEEL_MODEL_STREAM"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

_Number = TypeVar("_Number", int, float)


def read_environment(cwd: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: the process environment) overlaid on ``cwd/.env``."""
    env_file = cwd / ".env"
    from_file: dict[str, str] = {}
    if env_file.is_file():
        from_file = {k: v for k, v in dotenv_values(env_file).items() if v is not None}
    return {**from_file, **(os.environ if environ is None else environ)}


def resolve_model(spec: str, *, cwd: Path, environ: Mapping[str, str] | None = None) -> Model:
    """The model `spec` names, configured from the environment and ``cwd/.env``.

    The provider profile (`keel.models.profiles.profile_for`) names the key and base-URL
    variables and the provider's quirks. Answers are streamed unless KEEL_MODEL_STREAM
    is 0/false/no/off. Retry settings may be overridden by KEEL_MODEL_MAX_ATTEMPTS,
    KEEL_MODEL_MAX_WAIT (seconds of backoff in total), KEEL_MODEL_TIMEOUT (seconds
    per network operation) and KEEL_MODEL_MAX_ANSWER_SECONDS (seconds one attempt may
    take in all, 1800 by default). Raises `ConfigError` for a malformed spec, an unknown
    provider, a missing API key (naming the variable to set) or a bad setting.
    """
    provider, sep, rest = spec.partition(":")
    provider = provider.strip()
    rest = rest.strip()
    if not sep or not provider or not rest:
        raise ConfigError(f"malformed model spec {spec!r}: expected {ACCEPTED_FORMS}")
    if provider in ("scripted", "replay"):
        path = Path(rest).expanduser()
        path = path if path.is_absolute() else cwd / path
        if provider == "scripted":
            return ScriptedModel.from_file(path, spec=spec)
        from keel.models.cassette import ReplayModel  # noqa: PLC0415 - only when replaying

        return ReplayModel.from_file(path, spec=spec)
    try:
        defaults = profile_for(provider, "")
    except ConfigError:
        raise ConfigError(
            f"unknown model provider {provider!r} in {spec!r}: expected {ACCEPTED_FORMS}"
        ) from None
    env = read_environment(cwd, environ)
    api_key = env.get(defaults.key_variable, "").strip()
    if not api_key:
        local_hint = (
            "; a local server that needs no key accepts any value" if provider == "openai" else ""
        )
        raise ConfigError(
            f"model {spec} needs an API key: set {defaults.key_variable} "
            f"(in the environment or .env){local_hint}"
        )
    base_url = env.get(defaults.base_url_variable, "").strip() or defaults.default_base_url
    profile = profile_for(provider, base_url)
    return OpenAICompatModel(
        spec=f"{provider}:{rest}",
        model=rest,
        base_url=base_url,
        api_key=api_key,
        profile=profile,
        prices=load_price_table(cwd),
        stream=_switch(env, STREAM_VARIABLE, default=True),
        max_attempts=_setting(env, "KEEL_MODEL_MAX_ATTEMPTS", int, 5, minimum=1),
        max_wait=_setting(env, "KEEL_MODEL_MAX_WAIT", float, 60.0, minimum=0),
        timeout=_setting(env, "KEEL_MODEL_TIMEOUT", float, 120.0, minimum=0.001),
        max_answer_seconds=_setting(
            env, "KEEL_MODEL_MAX_ANSWER_SECONDS", float, MAX_ANSWER_SECONDS, minimum=0.001
        ),
        api_key_variable=profile.key_variable,
    )


def _switch(env: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} must be on or off: 1, true, yes, on or 0, false, no, off")


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
