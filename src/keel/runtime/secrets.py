"""Where a run's secret values come from: the I/O half of ``core/redact``.

A run can meet secrets in the process environment, in the ``.env`` files of the
current directory (model settings are read from there) and in the workspace's
``.env`` and ``.env.*`` files: at its top and up to three directories below, skipping
VCS, dependency and cache folders, reading at most 64 files of at most 1 MiB each, so
gathering stays cheap on any tree and never blocks on a FIFO planted as ``.env``.

A workspace's ``.env`` may be written during the run (by the model or a command), so
`refresh_redactor` reads the files again and adds what is new to the run's redactor:
a value once known stays redacted for the rest of the run, even after its file is gone.

A verify command is stored as written, so that a resume or a worker can run it again:
`refuse_secret_commands` refuses one that holds a secret instead of storing it.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

from dotenv import dotenv_values

from keel.core.errors import ConfigError
from keel.core.guard import DEFAULT_SECRET
from keel.core.redact import URL_CREDENTIAL, Redactor, dotenv_secrets, environment_secrets

MAX_DEPTH = 3  # directories below the workspace searched for .env files
MAX_FILES = 64  # .env files read per directory tree
MAX_DIRECTORIES = 2_000  # directories listed per tree
MAX_FILE_BYTES = 1 << 20  # bytes read of one .env file
TEMPLATE_SUFFIXES = (".example", ".sample", ".template", ".dist", ".defaults")
SKIPPED_DIRECTORIES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".keel",
        ".venv",
        "venv",
        "node_modules",
        "__pycache__",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "site-packages",
    }
)


def load_redactor(
    workspace: Path, *, cwd: Path | None = None, environ: Mapping[str, str] | None = None
) -> Redactor:
    """The redactor for a run in ``workspace``: the environment's secrets, then those of
    the ``.env`` files of ``workspace`` and ``cwd`` (default: the current directory)."""
    env = os.environ if environ is None else environ
    return Redactor.from_environment(env, dotenv_secret_pairs(workspace, cwd=cwd))


def refresh_redactor(
    current: Redactor,
    workspace: Path,
    *,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Redactor:
    """``current`` plus whatever secrets the environment and ``.env`` files hold now.

    Nothing is forgotten (a value deleted from ``.env`` may still sit in an output);
    ``current`` itself comes back when nothing is new.
    """
    env = os.environ if environ is None else environ
    return current.with_secrets(
        [*environment_secrets(env), *dotenv_secret_pairs(workspace, cwd=cwd)]
    )


class WorkspaceSecrets:
    """The secrets a run in ``workspace`` can meet, re-read when they may have changed.

    Handed to the driver (``keel.loop.driver.SecretSource``), which asks for a refresh
    before verification and after a call changed a secret file, and learns the values
    in ``.env`` text a call is about to write before the call is recorded.
    """

    def __init__(self, workspace: Path, *, cwd: Path | None = None) -> None:
        self.workspace = workspace
        self.cwd = cwd

    def load(self) -> Redactor:
        return load_redactor(self.workspace, cwd=self.cwd)

    def refresh(self, current: Redactor) -> Redactor:
        return refresh_redactor(current, self.workspace, cwd=self.cwd)

    def learn(self, current: Redactor, path: str, text: str) -> Redactor:
        name = path.rsplit("/", 1)[-1]
        return current.with_secrets(dotenv_text_secrets(text, template=is_template(name)))


def dotenv_secret_pairs(workspace: Path, *, cwd: Path | None = None) -> list[tuple[str, str]]:
    """``(name, value)`` pairs to redact from the ``.env`` files a run can meet (module doc).

    ``cwd``'s files are read at its top only: it may be a home directory.
    """
    files = dotenv_files(workspace)
    try:
        here = Path.cwd() if cwd is None else cwd
    except OSError:  # the working directory was removed
        here = workspace
    if _resolved(here) != _resolved(workspace):
        files += dotenv_files(here, depth=0)
    pairs: list[tuple[str, str]] = []
    for path in files:
        template = is_template(path.name)
        for values in read_dotenv(path):
            pairs.extend(dotenv_secrets(values, template=template))
    return pairs


def dotenv_files(root: Path, *, depth: int = MAX_DEPTH) -> list[Path]:
    """``.env`` and ``.env.*`` files at ``root`` and up to ``depth`` directories below,
    breadth first, in name order, within the module's bounds; symlinked directories and
    `SKIPPED_DIRECTORIES` are not entered."""
    found: list[Path] = []
    level = [root]
    listed = 0
    for below in range(depth + 1):
        deeper: list[Path] = []
        for directory in level:
            listed += 1
            if listed > MAX_DIRECTORIES:
                return found
            try:
                with os.scandir(directory) as listing:
                    entries = sorted(listing, key=lambda entry: entry.name)
            except OSError:
                continue
            for entry in entries:
                named = is_dotenv(entry.name)
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if is_dir:
                    # a virtualenv called .env is a tree of packages, not settings
                    if below < depth and not named and entry.name not in SKIPPED_DIRECTORIES:
                        deeper.append(Path(entry.path))
                elif named:
                    found.append(Path(entry.path))
                    if len(found) >= MAX_FILES:
                        return found
        level = deeper
    return found


def read_dotenv(path: Path) -> list[dict[str, str | None]]:
    """`parse_dotenv` of one file; ``[]`` when it is not a readable regular file.
    At most `MAX_FILE_BYTES` are read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    chunks: list[bytes] = []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        size = 0
        while size < MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return []
    finally:
        os.close(fd)
    return parse_dotenv(b"".join(chunks).decode("utf-8", "replace"))


def parse_dotenv(text: str) -> list[dict[str, str | None]]:
    """The variables of ``.env`` text as written and as interpolated (``${VAR}`` expanded,
    as programs see them): a value can turn up in either form."""
    return [
        dict(dotenv_values(stream=io.StringIO(text), interpolate=interpolate))
        for interpolate in (False, True)
    ]


def dotenv_text_secrets(text: str, *, template: bool = False) -> list[tuple[str, str]]:
    """``(name, value)`` pairs to redact from ``.env`` text not on disk yet: what a call
    is about to write to a ``.env*`` path (add them before its arguments are stored)."""
    return [
        pair for values in parse_dotenv(text) for pair in dotenv_secrets(values, template=template)
    ]


def is_dotenv(name: str) -> bool:
    """True for the file names gathered as settings (``.env``, ``.env.*``)."""
    return any(fnmatchcase(name, pattern) for pattern in DEFAULT_SECRET)


def is_template(name: str) -> bool:
    """True for ``.env.example`` and the like: committed placeholders, not settings."""
    return name.endswith(TEMPLATE_SUFFIXES)


def refuse_secret_commands(commands: Sequence[str], redactor: Redactor) -> None:
    """ConfigError for the first verify command that holds a secret, naming the command
    (redacted) and the variable, never the value; nothing else happens."""
    for number, command in enumerate(commands, start=1):
        found = redactor.secrets_in(command)
        if not found:
            continue
        names = [name for name in found if name != URL_CREDENTIAL]
        parts = ["a credential inside a URL"] if URL_CREDENTIAL in found else []
        parts += [f"the value of {', '.join(names)}"] if names else []
        what = " and ".join(parts)
        variable = names[0] if names else "DB_URL"
        raise ConfigError(
            f"--verify command {number} ({redactor.scrub_text(command)!r}) contains {what}: "
            "a verify command is stored as written so that a resume or a worker can run it, "
            "and Keel stores no secret. Put the value in an environment variable "
            f'({variable}), pass it to verifiers with [sandbox] env = ["{variable}"] in '
            f'.keel/config.toml, and write "${variable}" in the command instead.'
        )


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path
