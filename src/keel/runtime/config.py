"""``[sandbox]`` in ``.keel/config.toml``: how programs are confined, checked before a run.

    [sandbox]
    mode = "auto"            # required | auto | off (``--sandbox`` overrides)
    network = false          # may commands and verifiers open network connections?
    env = ["NPM_TOKEN"]      # variables passed through besides the allowlist
    read_only = ["~/.cargo"] # host paths visible read-only (toolchains outside /usr)
    cpu_seconds = 900        # CPU time of one program
    memory_mb = 8192         # memory (data segment) of one program
    processes = 1024         # processes alive at once in one call
    file_size_mb = 4096      # largest file one program may write
    orphans = "wait"         # on resume, a command a dead process left running: wait | kill

Every key is optional; a wrong key or value is a ConfigError naming the file and key.
The settings are stored with the run, so a resume or a worker confines the same way.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, cast

from keel.core.errors import ConfigError
from keel.sandbox.base import SANDBOX_MODES, OrphanPolicy, SandboxMode, SandboxSettings

CONFIG_FILE = Path(".keel") / "config.toml"
_LIMITS = ("cpu_seconds", "memory_mb", "processes", "file_size_mb")


def parse_sandbox_mode(value: str) -> SandboxMode:
    """``value`` as a sandbox mode; ConfigError listing the choices otherwise."""
    for mode in SANDBOX_MODES:
        if value == mode:
            return mode
    raise ConfigError(f"unknown sandbox mode {value!r}; choose one of {'|'.join(SANDBOX_MODES)}")


def load_sandbox_settings(cwd: Path, *, mode: str | None = None) -> SandboxSettings:
    """``[sandbox]`` of ``cwd/.keel/config.toml`` (defaults if absent), with ``mode`` on top."""
    path = cwd / CONFIG_FILE
    table: dict[str, Any] = {}
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
            raise ConfigError(f"{path}: cannot read the configuration: {exc}") from None
        raw = data.get("sandbox", {})
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: 'sandbox' must be a table ([sandbox])")
        table = raw
    settings = settings_from_dict(table, where=str(path))
    if mode is not None:
        settings = settings_from_dict({**settings.to_dict(), "mode": mode}, where="--sandbox")
    return settings


def settings_from_dict(
    d: dict[str, Any] | None, *, where: str = "stored options"
) -> SandboxSettings:
    """Inverse of ``SandboxSettings.to_dict``; ConfigError (naming ``where``) if malformed."""
    if not d:
        return SandboxSettings()
    known = set(SandboxSettings().to_dict())
    for key in d:
        if key not in known:
            raise ConfigError(
                f"{where}: unknown sandbox setting {key!r}; known: {', '.join(sorted(known))}"
            )
    values: dict[str, Any] = {}
    if "mode" in d:
        if not isinstance(d["mode"], str):
            raise ConfigError(f"{where}: sandbox mode must be a string")
        try:
            values["mode"] = parse_sandbox_mode(d["mode"])
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if "network" in d:
        if not isinstance(d["network"], bool):
            raise ConfigError(f"{where}: sandbox network must be true or false")
        values["network"] = d["network"]
    for key in ("env", "read_only"):
        if key in d:
            items = d[key]
            if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
                raise ConfigError(f"{where}: sandbox {key} must be a list of non-empty strings")
            values[key] = tuple(items)
    for key in _LIMITS:
        if key in d:
            number = d[key]
            if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
                raise ConfigError(f"{where}: sandbox {key} must be a positive whole number")
            values[key] = number
    if "orphans" in d:
        if d["orphans"] not in ("wait", "kill"):
            raise ConfigError(f"{where}: sandbox orphans must be 'wait' or 'kill'")
        values["orphans"] = cast(OrphanPolicy, d["orphans"])
    return SandboxSettings(**values)


__all__ = ["CONFIG_FILE", "load_sandbox_settings", "parse_sandbox_mode", "settings_from_dict"]
