"""Finding and loading agent specs: ``.keel/agents/NAME.md`` of a workspace, then the built-ins.

A workspace file wins over a built-in of the same name. Files are read from a
descriptor of the workspace one component at a time with ``O_NOFOLLOW``: a symbolic
link at ``.keel``, ``.keel/agents`` or the spec itself is refused, never followed (it
could lead outside the workspace), and so is anything but a regular file (a FIFO
cannot block the read). At most ``MAX_SPEC_BYTES`` are read. Parsing is
``keel.core.agent_spec``'s, the same for built-ins and workspace files.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from importlib import resources
from pathlib import Path

from keel.core.agent_spec import (
    MAX_SPEC_BYTES,
    NAME_PATTERN,
    AgentSpec,
    check_agent_name,
    parse_agent_spec,
)
from keel.core.errors import ConfigError
from keel.tools.builtin import BUILTIN_TOOLS

AGENTS_DIR = (".keel", "agents")
SUFFIX = ".md"
BUILTIN_AGENTS: tuple[str, ...] = ("explorer", "reviewer")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC


def builtin_tool_names() -> tuple[str, ...]:
    """The tool names an allowlist may use when the caller names none: the built-ins."""
    return tuple(tool.name for tool in BUILTIN_TOOLS)


def load_agent_spec(
    name: str, workspace: Path, *, known_tools: Collection[str] | None = None
) -> AgentSpec:
    """The spec named ``name``: the workspace's ``.keel/agents/NAME.md``, else the built-in.

    ConfigError (naming the file and line) for an invalid spec; for an unknown name, a
    ConfigError listing the names that exist.
    """
    check_agent_name(name, f"agent {name!r}")
    tools = builtin_tool_names() if known_tools is None else known_tools
    agents = _available_names(workspace)
    data = _read_workspace_spec(workspace, name)
    if data is not None:
        return parse_agent_spec(
            data,
            name=name,
            source=str(_spec_path(workspace, name)),
            known_tools=tools,
            known_agents=agents,
        )
    if name in BUILTIN_AGENTS:
        return _parse_builtin(name, tools, agents)
    raise ConfigError(
        f"no agent named {name!r}: add {_spec_path(workspace, name)} or use one of "
        f"{', '.join(sorted(agents))}"
    )


def list_agent_specs(
    workspace: Path, *, known_tools: Collection[str] | None = None
) -> list[AgentSpec | ConfigError]:
    """Every agent a parent in ``workspace`` could spawn, sorted by name.

    A broken file is listed as its ConfigError (whose message names the file and line)
    in its name's place, so one bad file never hides the others; an agents folder that
    cannot be read (a symbolic link) is listed first as its error, then the built-ins.
    """
    tools = builtin_tool_names() if known_tools is None else known_tools
    try:
        filenames = _workspace_files(workspace)
    except ConfigError as exc:
        return [exc, *(_parse_builtin(n, tools, BUILTIN_AGENTS) for n in sorted(BUILTIN_AGENTS))]
    agents = _available_names(workspace)
    found: dict[str, AgentSpec | ConfigError] = {}
    for filename in filenames:
        stem = filename[: -len(SUFFIX)]
        path = _spec_path(workspace, stem)
        try:
            check_agent_name(stem, str(path))
            data = _read_workspace_spec(workspace, stem)
            if data is None:  # removed since the listing
                continue
            found[stem] = parse_agent_spec(
                data, name=stem, source=str(path), known_tools=tools, known_agents=agents
            )
        except ConfigError as exc:
            found[stem] = exc
    for name in BUILTIN_AGENTS:
        if name not in found:
            found[name] = _parse_builtin(name, tools, agents)
    return [found[name] for name in sorted(found)]


# --- reading ---------------------------------------------------------------------------------


def _spec_path(workspace: Path, name: str) -> Path:
    return workspace.joinpath(*AGENTS_DIR, name + SUFFIX)


def _parse_builtin(name: str, tools: Collection[str], agents: Collection[str]) -> AgentSpec:
    data = (resources.files("keel.runtime") / "builtin_agents" / (name + SUFFIX)).read_bytes()
    return parse_agent_spec(
        data, name=name, source=f"builtin:{name}", known_tools=tools, known_agents=agents
    )


def _available_names(workspace: Path) -> frozenset[str]:
    """Built-in names and the well-named ``*.md`` entries of the workspace's agents folder."""
    names = {f[: -len(SUFFIX)] for f in _workspace_files(workspace)}
    return frozenset(n for n in names if NAME_PATTERN.fullmatch(n)) | set(BUILTIN_AGENTS)


def _open_agents_dir(workspace: Path) -> int | None:
    """A descriptor of ``.keel/agents`` reached without following links; None if absent."""
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"workspace {workspace} cannot be opened: {exc.strerror}") from None
    try:
        for part in AGENTS_DIR:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = workspace.joinpath(*AGENTS_DIR[: AGENTS_DIR.index(part) + 1])
                    raise ConfigError(
                        f"{where}: not a plain directory (a symbolic link or a file); "
                        "agent specs are read only from a real .keel/agents directory "
                        "inside the workspace"
                    ) from None
                raise
            os.close(fd)
            fd = child
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _workspace_files(workspace: Path) -> list[str]:
    """The names ending in ``.md`` in the workspace's agents folder (any kind of entry)."""
    fd = _open_agents_dir(workspace)
    if fd is None:
        return []
    try:
        with os.scandir(fd) as entries:
            return sorted(e.name for e in entries if e.name.endswith(SUFFIX))
    finally:
        os.close(fd)


def _read_workspace_spec(workspace: Path, name: str) -> bytes | None:
    """The bytes of the workspace's spec ``name`` (at most the size limit); None if absent."""
    path = _spec_path(workspace, name)
    agents = _open_agents_dir(workspace)
    if agents is None:
        return None
    try:
        try:
            fd = os.open(name + SUFFIX, _READ_FLAGS, dir_fd=agents)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError(
                    f"{path}: is a symbolic link; agent specs must be regular files inside "
                    "the workspace (a link could lead outside it)"
                ) from None
            raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    finally:
        os.close(agents)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: not a regular file")
        if info.st_size > MAX_SPEC_BYTES:
            raise ConfigError(
                f"{path}: {info.st_size} bytes, over the limit of {MAX_SPEC_BYTES} bytes "
                "for an agent spec"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_SPEC_BYTES:  # grew while being read
            raise ConfigError(f"{path}: over the limit of {MAX_SPEC_BYTES} bytes for an agent spec")
        return data
    finally:
        os.close(fd)
