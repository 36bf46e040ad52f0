"""The bubblewrap sandbox, tried as a hostile command would: real bwrap, real files, real sockets.

Every test that needs bubblewrap is skipped, with the reason printed, where bwrap is
missing or refused (``apt-get install bubblewrap``; see ``make test``).
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.guard import PathGuard
from keel.sandbox.base import Confinement, Sandbox, SandboxSettings
from keel.sandbox.bubblewrap import probe_bubblewrap
from keel.sandbox.choose import open_sandbox
from keel.tools import ToolContext, default_registry
from keel.verify.runner import TIMEOUT_EXIT_CODE, run_verifier

PY = sys.executable
MakeSandbox = Callable[..., Sandbox]


@pytest.fixture(scope="module")
def bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap): skipped")
    probe = probe_bubblewrap(path)
    if not probe.works:
        pytest.skip(f"bubblewrap does not work here ({probe.reason}): skipped")
    return path


@pytest.fixture
def make_sandbox(bwrap: str) -> MakeSandbox:
    def make(**settings: Any) -> Sandbox:
        sandbox = open_sandbox(SandboxSettings(mode="required", **settings))
        assert sandbox.kind == "bubblewrap"
        return sandbox

    return make


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


def git(ws: Path, *args: str) -> str:
    base = [
        "git",
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.com",
        "-c",
        "init.defaultBranch=main",
    ]
    done = subprocess.run([*base, *args], cwd=ws, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def repo(ws: Path) -> Path:
    (ws / "a.txt").write_text("one\n")
    git(ws, "init", "-q")
    git(ws, "add", "a.txt")
    git(ws, "commit", "-qm", "first")
    return ws


def call(
    sandbox: Sandbox,
    ws: Path,
    argv: list[str],
    *,
    guard: PathGuard | None = None,
    git_writable: bool = False,
    timeout: float = 60,
) -> tuple[int, str]:
    confinement = Confinement(workspace=ws, guard=guard or PathGuard(), git_writable=git_writable)
    proc = sandbox.popen(argv, confinement, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        sandbox.finish(proc)
    return proc.returncode, out.decode(errors="replace")


def sh(sandbox: Sandbox, ws: Path, script: str, *args: str, **kw: Any) -> tuple[int, str]:
    return call(sandbox, ws, ["sh", "-c", script, "sh", *args], **kw)


# --- what is visible -------------------------------------------------------------------


def test_the_home_directory_is_hidden(
    make_sandbox: MakeSandbox, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_home = tmp_path / "home"
    fake_home.mkdir()
    (fake_home / ".netrc").write_text("machine example.com password planted-home-secret\n")
    monkeypatch.setenv("HOME", str(fake_home))
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    planted = real_home / f".keel-sandbox-test-{uuid.uuid4().hex}"
    try:
        planted.write_text("planted-real-home-secret\n")
    except OSError:
        planted = fake_home / ".netrc"  # the real home is not writable: the fake one shows it
    script = (
        'echo "HOME=$HOME"; cat "$1"; cat "$2"; echo "listing: $(ls -a "$3" | tr "\\n" " ")"; '
        'cat "$3/.bashrc" >/dev/null 2>&1 || echo bashrc-hidden'
    )
    try:
        _, out = sh(
            make_sandbox(), ws, script, str(fake_home / ".netrc"), str(planted), str(real_home)
        )
    finally:
        if planted.parent == real_home:
            planted.unlink()
    assert "planted-home-secret" not in out and "planted-real-home-secret" not in out
    assert "HOME=/tmp/home" in out and "bashrc-hidden" in out
    listing = next(line for line in out.splitlines() if line.startswith("listing:"))
    assert planted.name not in listing and ".bashrc" not in listing


def test_writes_outside_the_workspace_do_not_reach_the_host(
    make_sandbox: MakeSandbox, ws: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    private = Path("/tmp") / f"keel-private-{uuid.uuid4().hex}"
    script = (
        'echo x > "$1/escaped"; echo x > /usr/keel-escaped; echo x > /etc/keel-escaped; '
        'echo x > "$2" && echo private-tmp-writable; echo x > inside.txt'
    )
    code, out = sh(make_sandbox(), ws, script, str(outside), str(private))
    assert not (outside / "escaped").exists()
    assert not Path("/usr/keel-escaped").exists() and not Path("/etc/keel-escaped").exists()
    assert "private-tmp-writable" in out and not private.exists()
    assert "Read-only file system" in out
    assert (ws / "inside.txt").read_text() == "x\n" and code == 0


def test_protected_paths_cannot_be_written_or_created(
    make_sandbox: MakeSandbox, repo: Path
) -> None:
    (repo / ".keel").mkdir()
    (repo / ".keel" / "keel.db").write_text("history")
    (repo / "data").mkdir()
    (repo / "data" / "store.db").write_text("store")
    config = (repo / ".git" / "config").read_text()
    script = (
        "echo '[core] fsmonitor = /tmp/x' >> .git/config; echo x > .git/hooks/pre-commit; "
        "echo gone > .keel/keel.db; rm -rf .keel; echo x > .keel/policy.toml; "
        "echo y > data/store.db; echo ok > free.txt"
    )
    guard = PathGuard(store_paths=("data/store.db",))
    _, out = sh(make_sandbox(), repo, script, guard=guard)
    assert (repo / ".git" / "config").read_text() == config
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".keel" / "keel.db").read_text() == "history"
    assert not (repo / ".keel" / "policy.toml").exists()
    assert (repo / "data" / "store.db").read_text() == "store"
    assert (repo / "free.txt").read_text() == "ok\n"
    assert out.count("Read-only file system") >= 4, out


def test_absent_protected_paths_cannot_be_created_and_leave_no_trace(
    make_sandbox: MakeSandbox, repo: Path
) -> None:
    shutil.rmtree(repo / ".git" / "hooks")
    script = (
        "mkdir -p .keel && echo x > .keel/policy.toml; mkdir -p .git/hooks; "
        "echo x > .git/hooks/post-checkout; echo ok > .git/allowed-when-writable; ls -a"
    )
    _, out = sh(make_sandbox(), repo, script, git_writable=True)
    assert not (repo / ".keel").exists()
    assert not (repo / ".git" / "hooks").exists()
    assert (repo / ".git" / "allowed-when-writable").exists()  # git_writable: .git is
    assert "Read-only file system" in out


def test_absent_store_files_stay_creatable_by_keel_during_a_call(
    make_sandbox: MakeSandbox, ws: Path
) -> None:
    (ws / "store.db").write_text("db")
    guard = PathGuard(store_paths=("store.db", "store.db-wal", "store.db-journal"))
    sandbox = make_sandbox()
    confinement = Confinement(workspace=ws, guard=guard)
    proc = sandbox.popen(
        ["sh", "-c", "sleep 0.5; echo x > store.db"],
        confinement,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        time.sleep(0.2)
        (ws / "store.db-journal").write_text("written by the store itself")
        out, _ = proc.communicate(timeout=30)
    finally:
        sandbox.finish(proc)
    assert b"Read-only file system" in out and (ws / "store.db").read_text() == "db"
    assert (ws / "store.db-journal").is_file()


def test_a_new_repository_cannot_be_created_without_git_writes(
    make_sandbox: MakeSandbox, ws: Path
) -> None:
    _, out = sh(make_sandbox(), ws, "git init -q && echo created")
    assert "created" not in out and not (ws / ".git").exists()


def test_secret_files_are_masked_and_cannot_be_overwritten(
    make_sandbox: MakeSandbox, ws: Path
) -> None:
    (ws / ".env").write_text("API_KEY=planted-dotenv-secret\n")
    (ws / "app" / "config").mkdir(parents=True)
    (ws / "app" / "config" / ".env.local").write_text("TOKEN=planted-nested-secret\n")
    (ws / "secrets").mkdir()
    (ws / "secrets" / "prod.key").write_text("planted-policy-secret\n")
    guard = PathGuard(secret=(".env", ".env.*", "secrets"))
    script = (
        'cat .env app/config/.env.local secrets/prod.key; echo "listing:$(ls -A secrets)"; '
        "echo x > .env; echo done"
    )
    _, out = sh(make_sandbox(), ws, script, guard=guard)
    for planted in ("planted-dotenv-secret", "planted-nested-secret", "planted-policy-secret"):
        assert planted not in out
    assert "listing:\n" in out and "done" in out
    assert (ws / ".env").read_text() == "API_KEY=planted-dotenv-secret\n"


def test_environment_secrets_do_not_reach_the_program(
    make_sandbox: MakeSandbox, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted-env-secret-123")
    monkeypatch.setenv("DATABASE_URL", "postgres://app:planted-url-password@db/app")
    monkeypatch.setenv("KEELT_PLAIN", "not-on-the-allowlist")
    monkeypatch.setenv("KEELT_NAMED", "passed-by-name")
    sandbox = make_sandbox(env=("KEELT_NAMED",))
    _, out = call(sandbox, ws, ["env"])
    assert "planted-env-secret" not in out and "planted-url-password" not in out
    assert "KEELT_PLAIN" not in out
    assert "KEELT_NAMED=passed-by-name" in out
    assert "HOME=/tmp/home" in out and "PATH=" in out


# --- network -----------------------------------------------------------------------------


@pytest.fixture
def loopback_server() -> Iterator[tuple[int, list[bytes]]]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                received.append(conn.recv(100))
                conn.sendall(b"pong")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join()
    server.close()


CONNECT = (
    "import socket, sys\n"
    "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
    "s.sendall(b'ping'); print('reply', s.recv(10))\n"
)


def test_network_connections_fail_unless_the_settings_allow_them(
    make_sandbox: MakeSandbox, ws: Path, loopback_server: tuple[int, list[bytes]]
) -> None:
    port, received = loopback_server
    code, out = call(make_sandbox(), ws, [PY, "-c", CONNECT, str(port)])
    assert code != 0 and "ConnectionRefusedError" in out and received == []
    code, out = call(make_sandbox(network=True), ws, [PY, "-c", CONNECT, str(port)])
    assert code == 0 and "reply b'pong'" in out and received == [b"ping"]


# --- what works ------------------------------------------------------------------------------


def test_builds_and_test_runs_in_the_workspace_work(make_sandbox: MakeSandbox, ws: Path) -> None:
    (ws / "calc").mkdir()
    (ws / "calc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_calc.py").write_text(
        "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (ws / "build.sh").write_text("mkdir -p dist && echo built > dist/out.txt && echo made\n")
    sandbox = make_sandbox()
    code, out = call(sandbox, ws, [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
    assert code == 0 and "1 passed" in out, out
    code, out = call(sandbox, ws, [PY, "-m", "compileall", "-q", "calc"])
    assert code == 0 and list((ws / "calc" / "__pycache__").glob("__init__.*.pyc"))
    code, out = call(sandbox, ws, ["sh", "build.sh"])
    assert code == 0 and (ws / "dist" / "out.txt").read_text() == "built\n"


def test_git_reads_work_and_commits_need_git_writes(make_sandbox: MakeSandbox, repo: Path) -> None:
    (repo / "a.txt").write_text("one\ntwo\n")
    sandbox = make_sandbox()
    code, out = sh(sandbox, repo, "git status --short && git log --oneline && git diff")
    assert code == 0 and "M a.txt" in out and "first" in out and "+two" in out
    commit = "git -c user.name=m -c user.email=m@x commit -qam second && echo committed"
    code, out = sh(sandbox, repo, commit)
    assert "committed" not in out and "first" in git(repo, "log", "--oneline")
    assert "second" not in git(repo, "log", "--oneline")
    code, out = sh(sandbox, repo, commit, git_writable=True)
    assert "committed" in out and "second" in git(repo, "log", "--oneline")
    code, out = sh(
        sandbox, repo, "git config core.fsmonitor /tmp/x && echo configured", git_writable=True
    )
    assert "configured" not in out and "fsmonitor" not in (repo / ".git" / "config").read_text()


def test_git_works_in_a_worktree_whose_git_directory_is_elsewhere(
    make_sandbox: MakeSandbox, repo: Path, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    git(repo, "worktree", "add", "-q", str(tree))
    (tree / "a.txt").write_text("one\nfrom the worktree\n")
    code, out = sh(make_sandbox(), tree.resolve(), "git status --short && git log --oneline")
    assert code == 0 and "M a.txt" in out and "first" in out, out


# --- run_command and verifiers through it ----------------------------------------------------


def test_run_command_runs_sandboxed_and_reports_its_process_group_first(
    make_sandbox: MakeSandbox, ws: Path
) -> None:
    spawned: list[tuple[int, bool]] = []

    def on_spawn(pgid: int) -> None:
        os.killpg(pgid, 0)  # the group exists while Keel is told about it
        spawned.append((pgid, (ws / "late.txt").exists()))

    sandbox = make_sandbox()
    ctx = ToolContext(
        workspace=ws, run_id="r", call_id="c", owner="o", sandbox=sandbox, on_spawn=on_spawn
    )
    args = {"argv": ["sh", "-c", "sleep 0.3; echo late > late.txt; cat /etc/shadow; echo ran"]}
    result = default_registry().execute("run_command", args, ctx)
    assert result.data["exit_code"] == 0 and "ran" in result.output
    assert result.data["sandbox"]["kind"] == "bubblewrap"
    assert result.data["sandbox"]["network"] is False
    assert len(spawned) == 1 and spawned[0][1] is False  # told before the command got far
    assert (ws / "late.txt").exists()


def test_a_verifier_runs_sandboxed_with_the_scrubbed_environment(
    make_sandbox: MakeSandbox, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted-verifier-secret-1")
    check = run_verifier(
        'echo "key=$OPENAI_API_KEY home=$HOME"; ls /root; touch checked; '
        "echo x >> .git/config || echo git-config-refused",
        workspace=repo,
        timeout_s=30,
        sandbox=make_sandbox(),
    )
    assert check.exit_code == 0
    assert "key= home=/tmp/home" in check.output and "git-config-refused" in check.output
    assert ".bashrc" not in check.output and (repo / "checked").exists()
    assert check.sandbox["kind"] == "bubblewrap"


def test_a_verifier_that_times_out_is_killed_with_its_children(
    make_sandbox: MakeSandbox, ws: Path
) -> None:
    token = f"30.{random.randrange(10**8):08d}"
    check = run_verifier(
        f"sleep {token} & sleep 31", workspace=ws, timeout_s=1, sandbox=make_sandbox()
    )
    assert check.exit_code == TIMEOUT_EXIT_CODE and "timed out" in check.output
    assert check.duration_s < 10
    assert not [pid for pid in _pids() if token in _cmdline(pid)]


# --- choosing the sandbox (no bubblewrap needed) ---------------------------------------------


def test_required_without_bubblewrap_refuses_with_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        open_sandbox(SandboxSettings(mode="required"), search_path=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and "apt-get install bubblewrap" in message
    assert "dnf install bubblewrap" in message and "pacman -S bubblewrap" in message


def test_auto_without_bubblewrap_is_unconfined_and_says_why(tmp_path: Path, ws: Path) -> None:
    sandbox = open_sandbox(SandboxSettings(mode="auto"), search_path=str(tmp_path))
    assert sandbox.kind == "none"
    assert "not installed" in sandbox.describe()["reason"]
    code, out = call(sandbox, ws, ["sh", "-c", "echo $HOME; pwd"])
    assert code == 0 and out.splitlines()[1] == str(ws)
    assert not Path(out.splitlines()[0]).exists()  # its fresh HOME is removed afterwards


def test_a_broken_bubblewrap_counts_as_missing(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "bubblewrap 9.9"; exit 0; fi\n'
        "echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1\n"
    )
    fake.chmod(0o755)
    auto = open_sandbox(SandboxSettings(mode="auto"), search_path=str(tmp_path))
    assert auto.kind == "none" and "setting up uid map" in auto.describe()["reason"]
    with pytest.raises(ConfigError, match="does not work here"):
        open_sandbox(SandboxSettings(mode="required"), search_path=str(tmp_path))


def test_off_is_unconfined_even_with_bubblewrap(ws: Path) -> None:
    sandbox = open_sandbox(SandboxSettings(mode="off"))
    assert sandbox.kind == "none" and "off" in sandbox.describe()["reason"]


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
