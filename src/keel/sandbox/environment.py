"""The environment a confined program sees: an allowlist, never the caller's secrets.

Only variables that locate tools or set the locale pass (``PATH``, ``LANG``,
``LC_*``, ``TERM``, ``TZ``, ``USER``, ``LOGNAME``), minus any whose name looks
secret or whose value carries a URL's credentials; ``HOME`` and ``TMPDIR`` point at
empty places the sandbox provides, so no dotfile of the user's is read by accident.
Names the settings list (``[sandbox] env``) pass as they are, even secret-looking
ones: naming a variable there is the user's explicit choice.
"""

from __future__ import annotations

from collections.abc import Mapping

from keel.core.redact import without_secrets

ALLOWED_NAMES: tuple[str, ...] = ("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME")
ALLOWED_PREFIXES: tuple[str, ...] = ("LC_",)
FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin"


def allowed(name: str) -> bool:
    """True for the variables every confined program inherits (before the secret filter)."""
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def scrubbed_environment(
    environ: Mapping[str, str],
    *,
    passed: tuple[str, ...] = (),
    home: str,
    tmpdir: str,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one program: allowlist, then ``passed`` names, then ``extra``.

    ``extra`` (the caller's own settings, e.g. git's hardening) is set exactly as given
    and wins over everything else.
    """
    env = without_secrets({name: value for name, value in environ.items() if allowed(name)})
    env.setdefault("PATH", FALLBACK_PATH)
    env.update({name: environ[name] for name in passed if name in environ})
    env["HOME"] = home
    env["TMPDIR"] = tmpdir
    if extra:
        env.update(extra)
    return env


__all__ = ["ALLOWED_NAMES", "ALLOWED_PREFIXES", "allowed", "scrubbed_environment"]
