"""apply_patch: integrate a child's changes (a git binary patch in the store) into the workspace.

Guarantees, in order: every path the patch names is judged before anything changes
(no absolute path, no ``..``, nothing below ``.git``, nothing the run's ``PathGuard``
protects, nothing whose real location leaves the workspace through a link); the
whole patch is checked against the workspace (``git apply --check``) and a conflict
is a ToolError that lists each file with the hunks that no longer apply, with no
file changed; then ``git apply`` writes all of it (git checks every file before it
writes one). The tool is VERIFY_THEN_CONTINUE: its intent is each touched path's
hash *after* the patch, computed by applying it to a scratch copy of those files,
so after a crash the ordinary hash comparison tells whether it was applied.

git here is :class:`Git`: the settings of ``keel.verify.diff.HardenedGit`` (no hooks,
fsmonitor, pager, external diff or textconv; every configured filter driver emptied;
no system or global configuration; ``HOME`` an empty directory), with explicit git
directory, work tree and index, stdin and stderr — what writing git needs.

When the call has a sandbox (a run's calls do), each git apply_patch starts runs
inside it: on the workspace with only the work tree writable (``.git`` and the
guard's protected paths read-only, secrets masked), on a scratch copy with nothing
else writable. The patch reaches git as a private file outside the workspace, shown
read-only to the confined git (``Confinement.readable``); the sandbox gives a program
no stdin. Without a sandbox (tests of the tools, and ``keel.runtime.worktrees``'s own
bookkeeping) git runs hardened but unconfined.

The permission gate judges a call by every path the patch touches, not by its
``artifact`` argument: :class:`PatchPaths` (built by the harness, which holds the
store) reads them for ``keel.policy.containment.ContainedPolicy``, which judges each
as a write of that path (deny and ask rules, protected paths). While a plan is
approved, a patch may not rewrite ``plans/PLAN.md`` (as no tool but ``plan_write`` may).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Protocol

from pydantic import Field

from keel.core.errors import NotFound, ToolError
from keel.core.guard import PLAN_FILE, PathGuard
from keel.core.pathnames import shown_path
from keel.sandbox.base import Confinement, Sandbox
from keel.sandbox.collect import collect_output
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool
from keel.tools.patch_staleness import stale_paths
from keel.tools.workspace import current_hash, refuse_protected
from keel.verify.diff import DRIVER_COMMANDS, OVERRIDES

GIT_TIMEOUT_S = 120.0
OUTPUT_CAP = 50_000_000  # bytes kept of a confined git's stdout
# Beyond HardenedGit's: a patch's shape must not depend on the repository's diff settings.
PATCH_OVERRIDES = (
    ("diff.noprefix", "false"),
    ("diff.mnemonicPrefix", "false"),
    ("diff.relative", "false"),
    ("diff.renames", "false"),
    ("apply.whitespace", "nowarn"),
    ("core.quotePath", "true"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
)
PATCH_DIFF_FLAGS = (
    "--binary",
    "--full-index",
    "--no-ext-diff",
    "--no-textconv",
    "--no-color",
    "--no-renames",
    "-O/dev/null",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)
HUNK_SHOWN_CHARS = 1500  # of one conflicting hunk
CONFLICT_SHOWN_CHARS = 12_000  # of the whole conflict report
IDENTITY = {
    "GIT_AUTHOR_NAME": "keel",
    "GIT_AUTHOR_EMAIL": "keel@localhost",
    "GIT_COMMITTER_NAME": "keel",
    "GIT_COMMITTER_EMAIL": "keel@localhost",
}


@dataclass(frozen=True, slots=True)
class GitOutput:
    code: int
    stdout: bytes
    stderr: bytes

    @property
    def message(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


@dataclass(frozen=True, slots=True, kw_only=True)
class Git:
    """One hardened git: runs no program the repository or the work tree configures.

    ``git_dir`` None means "not a repository": discovery is stopped at ``cwd``, so a
    repository above it is never used. With ``sandbox``, git runs inside it under
    ``confinement`` (default: ``cwd`` read-only) and takes no stdin; without, unconfined.
    """

    cwd: Path
    git_dir: Path | None = None
    work_tree: Path | None = None
    index_file: Path | None = None
    overrides: tuple[tuple[str, str], ...] = OVERRIDES + PATCH_OVERRIDES
    sandbox: Sandbox | None = field(default=None, compare=False)
    confinement: Confinement | None = None

    def environment(self) -> dict[str, str]:
        """git's variables; confined, ``PATH`` and ``HOME`` are the sandbox's own (its
        ``HOME`` is an empty directory that exists inside, as HardenedGit relies on)."""
        env: dict[str, str] = {"LC_ALL": "C"}
        if self.sandbox is None:
            home = str(empty_home())
            env |= {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": home,
                "XDG_CONFIG_HOME": home,
            }
        env |= {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_LITERAL_PATHSPECS": "1",
            "GIT_PAGER": "cat",
            "PAGER": "cat",
            "GIT_CEILING_DIRECTORIES": str(self.cwd.parent),
            "GIT_CONFIG_COUNT": str(len(self.overrides)),
            **IDENTITY,
        }
        if self.git_dir is not None:
            env["GIT_DIR"] = str(self.git_dir)
        if self.work_tree is not None:
            env["GIT_WORK_TREE"] = str(self.work_tree)
        if self.index_file is not None:
            env["GIT_INDEX_FILE"] = str(self.index_file)
        for number, (key, value) in enumerate(self.overrides):
            env[f"GIT_CONFIG_KEY_{number}"] = key
            env[f"GIT_CONFIG_VALUE_{number}"] = value
        return env

    def run(self, *args: str, stdin: bytes = b"", readable: tuple[Path, ...] = ()) -> GitOutput:
        """``git ARGS`` with its output; code -1 when git cannot run or times out.

        ``readable`` are host files a confined git must read (unconfined, all can be).
        """
        if self.sandbox is not None:
            if stdin:
                raise ValueError("a confined git reads no stdin: pass a readable file")
            return self._run_confined(self.sandbox, args, readable)
        try:
            done = subprocess.run(
                ["git", "--no-pager", *args],
                cwd=self.cwd,
                input=stdin,
                capture_output=True,
                env=self.environment(),
                timeout=GIT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return GitOutput(-1, b"", str(exc).encode())
        return GitOutput(done.returncode, done.stdout, done.stderr)

    def apply(self, *flags: str, patch: bytes) -> GitOutput:
        """``git apply FLAGS`` of ``patch``, handed over as a private file outside any workspace."""
        with _patch_file(patch) as path:
            return self.run("apply", *flags, str(path), readable=(path,))

    def _run_confined(
        self, sandbox: Sandbox, args: tuple[str, ...], readable: tuple[Path, ...]
    ) -> GitOutput:
        base = self.confinement or Confinement(workspace=self.cwd, workspace_writable=False)
        confinement = replace(base, cwd=self.cwd, readable=base.readable + readable)
        stdout = bytearray()

        def feed(chunk: bytes) -> None:
            stdout.extend(chunk[: max(OUTPUT_CAP - len(stdout), 0)])

        with tempfile.TemporaryFile() as stderr:
            try:
                proc = sandbox.popen(
                    ["git", "--no-pager", *args],
                    confinement,
                    stdout=subprocess.PIPE,
                    stderr=stderr.fileno(),
                    env=self.environment(),
                )
            except OSError as exc:
                return GitOutput(-1, b"", f"cannot start git in the sandbox: {exc}".encode())
            try:
                collected = collect_output(
                    proc,
                    feed,
                    deadline=time.monotonic() + GIT_TIMEOUT_S,
                    on_timeout=lambda: sandbox.finish(proc),
                )
                code = proc.wait()
            finally:
                sandbox.finish(proc)
            stderr.seek(0)
            said = stderr.read(OUTPUT_CAP)
        if collected.timed_out:
            return GitOutput(-1, bytes(stdout), said + b"\ngit timed out")
        return GitOutput(code, bytes(stdout), said)

    def must(self, *args: str, stdin: bytes = b"", doing: str) -> bytes:
        """stdout of ``git ARGS``; ToolError naming ``doing`` and git's words on failure."""
        out = self.run(*args, stdin=stdin)
        if out.code != 0:
            raise ToolError(f"{doing} failed: git {args[0]}: {out.message or f'exit {out.code}'}")
        return out.stdout

    def hardened(self) -> Git:
        """This git with every ``filter.<name>`` driver its configuration names emptied."""
        if self.git_dir is None:
            return self
        found = self.run("config", "-z", "--get-regexp", r"^filter\.").stdout
        drivers: set[str] = set()
        for entry in found.decode("utf-8", "surrogateescape").split("\0"):
            key = entry.split("\n", 1)[0]
            driver = key[len("filter.") :].rpartition(".")[0]
            if driver:
                drivers.add(driver)
        extra: list[tuple[str, str]] = []
        for driver in sorted(drivers):
            extra += [(f"filter.{driver}.{cmd}", "") for cmd in DRIVER_COMMANDS]
            extra.append((f"filter.{driver}.required", "false"))
        return replace(self, overrides=self.overrides + tuple(extra))


def empty_home() -> Path:
    """A private, empty, read-only directory for ``HOME``: no user configuration is found."""
    home = _made_home()
    if not home.is_dir():  # a temporary-files cleaner took it
        _made_home.cache_clear()
        home = _made_home()
    return home


@functools.cache
def _made_home() -> Path:
    made = Path(tempfile.mkdtemp(prefix="keel-git-home-"))
    made.chmod(0o500)
    return made


@contextmanager
def _patch_file(patch: bytes) -> Iterator[Path]:
    """``patch`` in a new private directory (0700) of the temporary directory; removed after."""
    folder = Path(tempfile.mkdtemp(prefix="keel-patch-in-"))
    try:
        path = folder / "change.patch"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(patch)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def workspace_git(
    workspace: Path, *, sandbox: Sandbox | None = None, guard: PathGuard | None = None
) -> Git:
    """Hardened git for applying into ``workspace``: its repository, or none.

    With ``sandbox`` it runs confined with the work tree writable, never ``.git`` nor
    what ``guard`` protects.
    """
    confinement = Confinement(
        workspace=workspace,
        guard=guard or PathGuard(),
        workspace_writable=True,
        git_writable=False,
    )
    git = Git(cwd=workspace, sandbox=sandbox, confinement=confinement if sandbox else None)
    dot_git = workspace / ".git"
    if dot_git.exists():
        return replace(git, git_dir=dot_git, work_tree=workspace).hardened()
    return git


def scratch_git(scratch: Path, sandbox: Sandbox | None, *, writable: bool) -> Git:
    """git outside any repository in ``scratch`` (confined to it with ``sandbox``)."""
    if sandbox is None:
        return Git(cwd=scratch)
    confinement = Confinement(workspace=scratch, workspace_writable=writable)
    return Git(cwd=scratch, sandbox=sandbox, confinement=confinement)


@dataclass(frozen=True, slots=True, kw_only=True)
class PatchSummary:
    """What an applied patch changed: workspace-relative path -> sha256 now ("" = gone)."""

    changed: dict[str, str]

    def describe(self) -> str:
        lines = [f"applied the patch: {len(self.changed)} file(s) changed"]
        lines += [f"  {'deleted' if not h else 'wrote'} {p}" for p, h in self.changed.items()]
        return "\n".join(lines)


def patch_paths(patch: bytes, sandbox: Sandbox | None = None) -> list[str]:
    """Every path the patch names (both sides of a rename), as git's own parser reads them."""
    if not patch.strip():
        raise ToolError("the patch is empty: there is nothing to apply")
    absolute = _ABSOLUTE.search(patch)
    if absolute is not None:
        line = absolute.group(0).decode("utf-8", "replace")
        raise ToolError(f"refusing the patch: it names an absolute path ({line.strip()!r})")
    scratch = Path(tempfile.mkdtemp(prefix="keel-patch-"))
    try:
        git = scratch_git(scratch, sandbox, writable=False)
        out = git.apply("--numstat", "-z", patch=patch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if out.code != 0:
        raise ToolError(f"the artifact is not a patch git can read: {out.message[:500]}")
    fields = out.stdout.decode("utf-8", "surrogateescape").split("\0")
    paths: list[str] = []
    at = 0
    while at < len(fields) and fields[at]:
        counts = fields[at].split("\t")
        if len(counts) == 3 and counts[2]:
            paths.append(counts[2])
            at += 1
        else:  # a rename or copy: "A\tD\t" then the old and the new path
            paths += [fields[at + 1], fields[at + 2]]
            at += 3
    return list(dict.fromkeys(paths))


def refuse_unsafe_paths(workspace: Path, paths: list[str], guard: PathGuard) -> list[str]:
    """The workspace-relative targets of ``paths``; ToolError at the first one the patch may
    not write (absolute, with ``..``, through a link or below .git, protected)."""
    targets: list[str] = []
    for path in paths:
        parts = path.split("/")
        if path.startswith("/") or ".." in parts:
            raise ToolError(f"refusing the patch: {path!r} leads outside the workspace")
        if any(part.casefold() == ".git" for part in parts):
            raise ToolError(f"refusing the patch: {path!r} is inside git's own directory")
        refuse_protected(path, path, guard)
        _refuse_linked_parents(workspace, path, parts)
        rel = path
        targets.append(rel)
    return targets


def _refuse_linked_parents(workspace: Path, path: str, parts: list[str]) -> None:
    """ToolError when a directory on the way to ``path`` is a link or not a directory.

    The last part is not followed: a link there is itself what the patch changes.
    """
    current = workspace
    for part in parts[:-1]:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return  # the rest is created by the patch
        if stat.S_ISLNK(mode):
            raise ToolError(
                f"refusing the patch: {path!r} goes through the symbolic link "
                f"{current.relative_to(workspace).as_posix()!r}; a patch writes only real paths"
            )
        if not stat.S_ISDIR(mode):
            raise ToolError(f"refusing the patch: {path!r} needs a directory where a file is")


def check_patch(workspace: Path, patch: bytes, git: Git | None = None) -> None:
    """ToolError listing each file and its hunks that do not apply; nothing is changed."""
    git = git or workspace_git(workspace)
    out = git.apply("--check", patch=patch)
    if out.code == 0:
        return
    raise ToolError(_conflict_report(git, patch, out.message))


def apply_patch_bytes(
    workspace: Path, patch: bytes, guard: PathGuard, *, sandbox: Sandbox | None = None
) -> PatchSummary:
    """Apply ``patch`` to ``workspace`` all or nothing (module doc); what it changed."""
    paths = _judged_paths(workspace, patch, guard, sandbox)
    git = workspace_git(workspace, sandbox=sandbox, guard=guard)
    check_patch(workspace, patch, git)
    out = git.apply(patch=patch)
    if out.code != 0:  # the workspace changed between the check and the apply
        raise ToolError(_conflict_report(git, patch, out.message))
    return PatchSummary(changed={shown_path(p): _hash_now(workspace, p) for p in paths})


def patched_hashes(
    workspace: Path, patch: bytes, guard: PathGuard, *, sandbox: Sandbox | None = None
) -> dict[str, str]:
    """Each path the patch touches -> its sha256 once applied ("" = deleted); changes nothing.

    The patch is applied to a scratch copy of just those files; a patch that would be
    refused or would not apply raises the same ToolError the tool would.
    """
    paths = _judged_paths(workspace, patch, guard, sandbox)
    check_patch(workspace, patch, workspace_git(workspace, sandbox=sandbox, guard=guard))
    scratch = Path(tempfile.mkdtemp(prefix="keel-patch-"))
    try:
        for rel in paths:
            _copy_preimage(workspace / rel, scratch / rel)
        out = scratch_git(scratch, sandbox, writable=True).apply(patch=patch)
        if out.code != 0:
            raise ToolError(f"applying to a scratch copy failed: git apply: {out.message}")
        return {shown_path(rel): _hash_now(scratch, rel) for rel in paths}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _judged_paths(
    workspace: Path, patch: bytes, guard: PathGuard, sandbox: Sandbox | None
) -> list[str]:
    """The patch's paths once judged safe; confined, also none the sandbox masks."""
    paths = refuse_unsafe_paths(workspace, patch_paths(patch, sandbox), guard)
    if sandbox is not None and sandbox.kind != "none":
        for path in paths:
            if not guard.listable(path):
                raise ToolError(
                    f"refusing the patch: {path!r} is secret or denied, and the sandbox hides "
                    "it from programs; change it with edit_file or write_file instead"
                )
    return paths


class ArtifactReader(Protocol):
    def get_artifact(self, artifact_id: str) -> tuple[Any, bytes]: ...


APPLY_PATCH = "apply_patch"
_READ_PATHS_KEPT = 64  # artifacts whose paths a PatchPaths remembers (artifacts never change)


class PatchPaths:
    """``keel.policy.containment.CallPaths`` for apply_patch: the paths its artifact's patch
    touches, read from ``artifacts`` (the run's store) with git's own parser; None for
    any other tool. An artifact that is missing or not a patch is a ToolError."""

    def __init__(self, artifacts: ArtifactReader, sandbox: Sandbox | None = None) -> None:
        self._artifacts = artifacts
        self._sandbox = sandbox
        self._known: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def __call__(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str] | None:
        if tool != APPLY_PATCH:
            return None
        artifact = arguments.get("artifact")
        if not isinstance(artifact, str) or not artifact:
            raise ToolError("apply_patch needs the id of a patch artifact (art_...)")
        with self._lock:
            known = self._known.get(artifact)
        if known is not None:
            return known
        paths = tuple(patch_paths(_artifact_bytes(self._artifacts, artifact), self._sandbox))
        with self._lock:
            if len(self._known) >= _READ_PATHS_KEPT:
                self._known.pop(next(iter(self._known)))
            self._known[artifact] = paths
        return paths


def _refuse_plan_file(ctx: ToolContext, paths: list[str]) -> None:
    """While a plan is approved, plans/PLAN.md changes only through plan_write."""
    if ctx.state is not None and ctx.state.approved_plan_sha256 is not None and PLAN_FILE in paths:
        raise ToolError(
            f"refusing the patch: it changes {PLAN_FILE}, which holds the approved plan; "
            "change the plan with plan_write (it asks for a new approval)"
        )


def _patch_intent(ctx: ToolContext, artifact: str) -> dict[str, str]:
    patch = _read_artifact(ctx, artifact)
    hashes = patched_hashes(ctx.workspace, patch, ctx.guard, sandbox=ctx.sandbox)
    _refuse_plan_file(ctx, list(hashes))
    return hashes


@tool(effect=Effect.WRITE, recovery=Recovery.VERIFY_THEN_CONTINUE, intent=_patch_intent)
def apply_patch(
    ctx: ToolContext,
    artifact: Annotated[
        str, Field(min_length=1, description="Id of the patch artifact (art_...) to apply.")
    ],
) -> ToolResult:
    """Apply a patch artifact (a subagent's changes) to the workspace, all or nothing.

    A hunk that no longer applies is an error listing the conflicting hunks; then no
    file is changed.
    """
    patch = _read_artifact(ctx, artifact)
    _refuse_plan_file(ctx, patch_paths(patch, ctx.sandbox))
    summary = apply_patch_bytes(ctx.workspace, patch, ctx.guard, sandbox=ctx.sandbox)
    return ToolResult(output=summary.describe(), changed_files=summary.changed)


# --- internals -----------------------------------------------------------------------


def _read_artifact(ctx: ToolContext, artifact: str) -> bytes:
    if ctx.store is None:
        raise ToolError("apply_patch needs the run's store to read the artifact; none is open")
    return _artifact_bytes(ctx.store, artifact)


def _artifact_bytes(artifacts: ArtifactReader, artifact: str) -> bytes:
    try:
        _, content = artifacts.get_artifact(artifact)
    except NotFound:
        raise ToolError(
            f"no artifact {artifact!r}; use the patch artifact id the subagent's result names"
        ) from None
    return content


def _hash_now(root: Path, rel: str) -> str:
    """sha256 of the file ``rel`` ("" absent); a link's is its target's, as current_hash
    finds it, and that of the link's text when it leads outside (git stores the text)."""
    try:
        return current_hash(root, rel)
    except ToolError:
        if not (root / rel).is_symlink():
            raise
        return hashlib.sha256(
            os.readlink(root / rel).encode("utf-8", "surrogateescape")
        ).hexdigest()


def _copy_preimage(source: Path, target: Path) -> None:
    try:
        st = os.lstat(source)
    except FileNotFoundError:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if stat.S_ISLNK(st.st_mode):
        target.symlink_to(os.readlink(source))
    elif stat.S_ISREG(st.st_mode):
        shutil.copy2(source, target, follow_symlinks=False)


_ABSOLUTE = re.compile(rb'(?m)^(?:(?:---|\+\+\+) "?/(?!dev/null\s*$)|diff --git "?/).*$')
_FAILED = re.compile(r"^error: (?:patch failed: (.+):\d+|(.+?): (?:patch does not apply|.+))$")


def _conflict_report(git: Git, patch: bytes, message: str) -> str:
    """git's refusal, and for each file the hunks that do not apply on their own, bounded."""
    failing: list[str] = []
    for line in message.splitlines():
        match = _FAILED.match(line)
        name = match and (match.group(1) or match.group(2))
        if name and name not in failing:
            failing.append(name)
    parts = ["the patch does not apply; no file was changed.", "git says:", message[:2000]]
    for path, header, hunks in _sections(patch):
        if path not in failing:
            continue
        bad = [h for h in hunks if git.apply("--check", patch=header + h).code != 0]
        if not hunks or not bad:
            continue
        parts.append(f"--- {path}: {len(bad)} of {len(hunks)} hunk(s) do not apply:")
        for hunk in bad:
            text = hunk.decode("utf-8", "replace")
            if len(text) > HUNK_SHOWN_CHARS:
                text = text[:HUNK_SHOWN_CHARS] + f"… [{len(text) - HUNK_SHOWN_CHARS} more chars]"
            parts.append(text.rstrip("\n"))
    report = "\n".join(parts)
    if len(report) > CONFLICT_SHOWN_CHARS:
        report = report[:CONFLICT_SHOWN_CHARS] + "\n… [conflict report cut]"
    return report + "\nRead the files as they are now, and redo those changes by hand."


def _sections(patch: bytes) -> list[tuple[str, bytes, list[bytes]]]:
    """(path, header, hunks) per ``diff --git`` section of a text patch."""
    found: list[tuple[str, bytes, list[bytes]]] = []
    for chunk in re.split(rb"(?m)^(?=diff --git )", patch):
        if not chunk.startswith(b"diff --git "):
            continue
        pieces = re.split(rb"(?m)^(?=@@ )", chunk)
        header, hunks = pieces[0], pieces[1:]
        path = _section_path(header)
        if path:
            found.append((path, header, hunks))
    return found


def _section_path(header: bytes) -> str:
    for line in header.splitlines():
        for prefix in (b"+++ b/", b"--- a/"):
            if line.startswith(prefix):
                return line[len(prefix) :].decode("utf-8", "surrogateescape")
    return ""


__all__ = [
    "APPLY_PATCH",
    "PATCH_DIFF_FLAGS",
    "ArtifactReader",
    "Git",
    "GitOutput",
    "PatchPaths",
    "PatchSummary",
    "apply_patch",
    "apply_patch_bytes",
    "check_patch",
    "patch_paths",
    "patched_hashes",
    "refuse_unsafe_paths",
    "scratch_git",
    "stale_paths",
    "workspace_git",
]
