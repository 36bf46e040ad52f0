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

Not yet in `default_registry`: SPEC says every program run for the model runs inside
the OS sandbox, and this git runs hardened but unconfined (the sandbox's ``popen``
gives a program no stdin to read a patch from). It joins the built-in tools with
delegation (issue 13), once its git runs confined.
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

from pydantic import Field

from keel.core.errors import NotFound, ToolError
from keel.core.guard import PathGuard
from keel.core.pathnames import shown_path
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool
from keel.tools.workspace import current_hash, refuse_protected
from keel.verify.diff import DRIVER_COMMANDS, OVERRIDES

GIT_TIMEOUT_S = 120.0
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
    repository above it is never used.
    """

    cwd: Path
    git_dir: Path | None = None
    work_tree: Path | None = None
    index_file: Path | None = None
    overrides: tuple[tuple[str, str], ...] = OVERRIDES + PATCH_OVERRIDES

    def environment(self) -> dict[str, str]:
        home = str(empty_home())
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LC_ALL": "C",
            "HOME": home,
            "XDG_CONFIG_HOME": home,
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

    def run(self, *args: str, stdin: bytes = b"") -> GitOutput:
        """``git ARGS`` with its output; code -1 when git cannot run or times out."""
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


def workspace_git(workspace: Path) -> Git:
    """Hardened git for applying into ``workspace``: its repository, or none."""
    dot_git = workspace / ".git"
    if dot_git.exists():
        return Git(cwd=workspace, git_dir=dot_git, work_tree=workspace).hardened()
    return Git(cwd=workspace)


@dataclass(frozen=True, slots=True, kw_only=True)
class PatchSummary:
    """What an applied patch changed: workspace-relative path -> sha256 now ("" = gone)."""

    changed: dict[str, str]

    def describe(self) -> str:
        lines = [f"applied the patch: {len(self.changed)} file(s) changed"]
        lines += [f"  {'deleted' if not h else 'wrote'} {p}" for p, h in self.changed.items()]
        return "\n".join(lines)


def patch_paths(patch: bytes) -> list[str]:
    """Every path the patch names (both sides of a rename), as git's own parser reads them."""
    if not patch.strip():
        raise ToolError("the patch is empty: there is nothing to apply")
    absolute = _ABSOLUTE.search(patch)
    if absolute is not None:
        line = absolute.group(0).decode("utf-8", "replace")
        raise ToolError(f"refusing the patch: it names an absolute path ({line.strip()!r})")
    scratch = Path(tempfile.mkdtemp(prefix="keel-patch-"))
    try:
        out = Git(cwd=scratch).run("apply", "--numstat", "-z", "-", stdin=patch)
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
    out = git.run("apply", "--check", "-", stdin=patch)
    if out.code == 0:
        return
    raise ToolError(_conflict_report(git, patch, out.message))


def apply_patch_bytes(workspace: Path, patch: bytes, guard: PathGuard) -> PatchSummary:
    """Apply ``patch`` to ``workspace`` all or nothing (module doc); what it changed."""
    paths = refuse_unsafe_paths(workspace, patch_paths(patch), guard)
    git = workspace_git(workspace)
    check_patch(workspace, patch, git)
    out = git.run("apply", "-", stdin=patch)
    if out.code != 0:  # the workspace changed between the check and the apply
        raise ToolError(_conflict_report(git, patch, out.message))
    return PatchSummary(changed={shown_path(p): _hash_now(workspace, p) for p in paths})


def patched_hashes(workspace: Path, patch: bytes, guard: PathGuard) -> dict[str, str]:
    """Each path the patch touches -> its sha256 once applied ("" = deleted); changes nothing.

    The patch is applied to a scratch copy of just those files; a patch that would be
    refused or would not apply raises the same ToolError the tool would.
    """
    paths = refuse_unsafe_paths(workspace, patch_paths(patch), guard)
    check_patch(workspace, patch)
    scratch = Path(tempfile.mkdtemp(prefix="keel-patch-"))
    try:
        for rel in paths:
            _copy_preimage(workspace / rel, scratch / rel)
        Git(cwd=scratch).must("apply", "-", stdin=patch, doing="applying to a scratch copy")
        return {shown_path(rel): _hash_now(scratch, rel) for rel in paths}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _patch_intent(ctx: ToolContext, artifact: str) -> dict[str, str]:
    return patched_hashes(ctx.workspace, _read_artifact(ctx, artifact), ctx.guard)


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
    summary = apply_patch_bytes(ctx.workspace, _read_artifact(ctx, artifact), ctx.guard)
    return ToolResult(output=summary.describe(), changed_files=summary.changed)


# --- internals -----------------------------------------------------------------------


def _read_artifact(ctx: ToolContext, artifact: str) -> bytes:
    if ctx.store is None:
        raise ToolError("apply_patch needs the run's store to read the artifact; none is open")
    try:
        _, content = ctx.store.get_artifact(artifact)
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
        bad = [h for h in hunks if git.run("apply", "--check", "-", stdin=header + h).code != 0]
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
    "PATCH_DIFF_FLAGS",
    "Git",
    "GitOutput",
    "PatchSummary",
    "apply_patch",
    "apply_patch_bytes",
    "check_patch",
    "patch_paths",
    "patched_hashes",
    "refuse_unsafe_paths",
    "workspace_git",
]
