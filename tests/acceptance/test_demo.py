"""`keel demo` end to end: offline, no key, a verified remediation stored like any run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.demo.story import FIXED_PIN, VULNERABLE_PIN
from keel.store.url import open_store

KEEL = str(Path(sys.executable).with_name("keel"))
SECRET_VARIABLES = ("DEEPSEEK_API_KEY", "OPENAI_API_KEY", "KEEL_MODEL", "KEEL_STORE", "KEEL_FAULT")


def run_demo(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
    env["TMPDIR"] = str(cwd)  # the demo's temporary workspace lands inside the test's dir
    return subprocess.run(
        [KEEL, "demo", *extra],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_completes_offline_with_verifier_evidence_in_the_default_store(
    tmp_path: Path,
) -> None:
    done = run_demo(tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    run_id = re.search(r"run (run_[0-9a-f]+): completed", done.stdout)
    assert run_id is not None, done.stdout
    rid = run_id.group(1)
    assert f"keel show {rid}\n" in done.stdout  # default store: no --store flag needed
    assert f"keel events {rid}\n" in done.stdout
    assert (tmp_path / ".keel" / "keel.db").exists()

    with open_store(f"sqlite:///{tmp_path / '.keel' / 'keel.db'}") as store:
        state = store.load_run(rid)
        events = store.read_events(rid)
        assert state.status is RunStatus.COMPLETED
        assert state.mode == "auto"
        workspace = Path(state.workspace)
        assert workspace.is_relative_to(tmp_path)
        assert FIXED_PIN in (workspace / "requirements.txt").read_text()
        assert (workspace / "tests" / "test_dependencies.py").exists()
        # The story: inspect, plan, change the pin, add a test, run the tests, complete.
        called = [e.data["tool"] for e in events if e.type is EventType.TOOL_FINISHED]
        for tool in ("read_file", "todo_write", "edit_file", "write_file", "run_command"):
            assert tool in called
        assert called[-1] == "request_completion"
        # The verifiers (the tests and the security check) passed on the final files.
        (passed,) = [e for e in events if e.type is EventType.VERIFICATION_PASSED]
        commands = [r["command"] for r in passed.data["records"]]
        assert any("unittest" in c for c in commands)
        assert any("check_security.py" in c for c in commands)
        assert all(r["exit_code"] == 0 for r in passed.data["records"])
        assert [v.mutation_revision for v in state.validations] == [2, 2]
        # Evidence: each verifier's output and the diff, as stored artifacts.
        evidence = {}
        assert state.result is not None
        assert set(state.result["evidence"]) == {"unit_tests", "security", "code_diff"}
        for ref in state.result["evidence"].values():
            artifact, content = store.get_artifact(ref.removeprefix("artifact:"))
            evidence[artifact.name] = content.decode()
        assert "Ran 5 tests" in evidence["verify-1.log"] and "OK" in evidence["verify-1.log"]
        assert "ok: no known advisory" in evidence["verify-2.log"]
        assert f"-{VULNERABLE_PIN}" in evidence["diff.patch"]
        assert f"+{FIXED_PIN}" in evidence["diff.patch"]
        assert "+++ b/tests/test_dependencies.py" in evidence["diff.patch"]


def test_demo_sample_really_fails_its_security_check_before_the_fix(tmp_path: Path) -> None:
    done = run_demo(tmp_path, "--store", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"--store sqlite:///{tmp_path / 'elsewhere.db'}" in done.stdout
    with open_store(f"sqlite:///{tmp_path / 'elsewhere.db'}") as store:
        (state,) = store.list_runs()
        events = store.read_events(state.run_id)
    check_runs = [
        e.data["output"]
        for e in events
        if e.type is EventType.TOOL_FINISHED
        and e.data["tool"] == "run_command"
        and "check_security.py" in e.data["arguments"]["argv"]
    ]
    assert check_runs and "VULNERABLE requests==2.19.1" in check_runs[0]
    assert not (tmp_path / ".keel").exists()  # --store was honoured
