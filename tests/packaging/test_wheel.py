"""The wheel users install: built from the repository's files, installed into a clean
virtual environment, and run from there with nothing of this checkout in reach.

Source: a copy of the files git would commit — tracked and untracked-but-not-ignored
(``git ls-files --cached --others --exclude-standard``). In CI, which runs in a fresh
clone, that is exactly the clone; locally it also holds work not committed yet, and
leaves out build leftovers (``build/``, ``*.egg-info``, ``__pycache__``) that could
hide a file missing from the package data. The wheel is built the way ``python -m
build`` builds it for a release (an isolated build environment with the setuptools
``pyproject.toml`` asks for), installed with its ``server`` extra from the package
index into a new virtual environment, then ``keel demo`` and ``keel serve`` must work
from it alone: the store's SQL, the demo and the console's assets come from the wheel.

The new environment is made ``--without-pip`` and this environment's pip installs into
it (``pip --python``) with ``--no-compile``: the same files installed, without
bootstrapping a pip that would run once, and without byte-compiling every module of
every dependency up front (Python compiles the ones it imports).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTION = "keel-harness"
STEP_TIMEOUT_S = 240  # one build or one install; a slow package index is not a hang


@dataclass(frozen=True, slots=True)
class Installed:
    source: Path  # the copy the wheel was built from
    wheel: Path
    venv: Path
    scratch: Path  # where the installed commands run (cwd), outside the repository
    env: dict[str, str]

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            cwd=self.scratch,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _committable_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    # --cached still names a tracked file deleted in the work tree: it would not be committed.
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


def _step(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}"


def _clean_env(scratch: Path, venv: Path) -> dict[str, str]:
    """The caller's environment less whatever could reach this checkout or its venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        and not k.startswith("KEEL_")
    }
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["TMPDIR"] = str(scratch / "tmp")  # the demo's workspace lands in the test's folder
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    for name in _committable_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    dist = root / "dist"
    _step([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)], cwd=root)
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    venv = root / "venv"
    _step([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    scratch = root / "scratch"
    (scratch / "tmp").mkdir(parents=True)
    env = _clean_env(scratch, venv)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    _step(
        [*pip, "install", "--quiet", "--no-compile", f"{wheels[0]}[server]"], cwd=scratch, env=env
    )
    return Installed(source=source, wheel=wheels[0], venv=venv, scratch=scratch, env=env)


def test_the_wheel_holds_every_file_of_the_package(installed: Installed) -> None:
    """Every file under src/keel — code, SQL, demo, built-in agents, console assets —
    is in the wheel, under the distribution name and with the `keel` command."""
    package = installed.source / "src" / "keel"
    expected = {
        "keel/" + path.relative_to(package).as_posix()
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        dist_info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(dist_info).decode()
        entry_points = wheel.read(dist_info.replace("METADATA", "entry_points.txt")).decode()
    assert expected - names == set()
    for kind in ("server/static/index.html", "store/sqlite/migrations/", "store/postgres/"):
        assert any(n.startswith("keel/" + kind) for n in names), kind
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"\nName: {DISTRIBUTION}\n" in metadata
    assert f"\nVersion: {version}\n" in metadata
    assert re.search(r"^keel = keel\.cli\.app:main$", entry_points, re.MULTILINE)


def test_keel_is_imported_from_the_new_environment(installed: Installed) -> None:
    probe = (
        "import json, importlib.metadata as m, keel, keel.server.console as c;"
        "print(json.dumps({'keel': keel.__file__, 'static': str(c.STATIC_DIR),"
        f" 'version': m.version({DISTRIBUTION!r})}}))"
    )
    done = installed.run(installed.bin("python"), "-c", probe)
    assert done.returncode == 0, done.stderr
    where = json.loads(done.stdout)
    site = (installed.venv / "lib").resolve()
    for path in (where["keel"], where["static"]):
        assert Path(path).resolve().is_relative_to(site), path
        assert not Path(path).resolve().is_relative_to(REPO), path
    assert (Path(where["static"]) / "index.html").is_file()


def test_keel_demo_runs_from_the_wheel(installed: Installed) -> None:
    done = installed.run(installed.bin("keel"), "demo", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Keel demo — offline")
    assert re.search(r"^run run_\w+: completed \(verified\)$", done.stdout, re.MULTILINE), (
        done.stdout
    )
    assert (installed.scratch / ".keel" / "keel.db").is_file()  # its store, made by the wheel's SQL


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def serving(installed: Installed) -> Iterator[tuple[str, str]]:
    """``keel serve`` of the new environment on a free loopback port, and a token made
    by its ``keel token create``; yields (base URL, token)."""
    store = f"sqlite:///{installed.scratch / 'serve.db'}"
    made = installed.run(
        installed.bin("keel"), "token", "create", "wheel-test", "--json", "--store", store
    )
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    port = _free_port()
    log = installed.scratch / "serve.log"
    with log.open("w") as output:
        server = subprocess.Popen(
            [installed.bin("keel"), "serve", "--port", str(port), "--store", store],
            cwd=installed.scratch,
            env=installed.env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, f"keel serve exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"keel serve did not answer:\n{log.read_text()}"
            try:
                httpx.get(f"{base}/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield base, token
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_keel_serve_serves_the_console_and_the_api_from_the_wheel(
    installed: Installed, serving: tuple[str, str]
) -> None:
    base, token = serving
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=10) as client:
        page = client.get("/")
        script = client.get("/static/app.js")
        healthy = client.get("/healthz", headers=auth)
        refused = client.get("/healthz")
        metrics = client.get("/metrics", headers=auth)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "<title>Keel</title>" in page.text
    assert script.status_code == 200 and script.text.strip()
    assert healthy.status_code == 200 and healthy.json() == {"ok": True}
    assert refused.status_code == 401
    assert metrics.status_code == 200, (installed.scratch / "serve.log").read_text()
    assert "# TYPE keel_runs gauge" in metrics.text.splitlines()
