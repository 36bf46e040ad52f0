"""The offline demo: a sample service with a vulnerable pin, and the scripted remediation.

``prepare_workspace`` copies the bundled service (``keel/demo/service``) into a
directory and commits it to a fresh git repository, so the run's diff artifact
shows exactly what the agent changed. ``remediation_turns`` is the model's side
of the story as a ``scripted:`` script: inspect the manifest and the code, write
todos, change the pin, add a regression test, run the tests, request completion.
The harness runs every call for real and the verifiers decide completion.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from keel.core.errors import ConfigError

SAMPLE = Path(__file__).resolve().parent / "service"
VULNERABLE_PIN = "requests==2.19.1"
FIXED_PIN = "requests==2.32.4"
GOAL = (
    "The inventory service pins a dependency with known security advisories. Move the pin "
    "to a release without known advisories, add a regression test so it cannot come back, "
    "and keep the test suite passing."
)
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")

REGRESSION_TEST = '''"""Regression: no pinned dependency may carry a known advisory."""

from __future__ import annotations

import unittest
from pathlib import Path

import check_security

ROOT = Path(__file__).resolve().parent.parent


class DependencyPinsTest(unittest.TestCase):
    def test_no_pin_has_a_known_advisory(self) -> None:
        found = check_security.findings(ROOT / "requirements.txt", ROOT / "advisories.json")
        self.assertEqual(found, [])

    def test_requests_is_pinned_past_every_listed_advisory(self) -> None:
        pins = check_security.read_pins(ROOT / "requirements.txt")
        self.assertGreaterEqual(check_security.parse_version(pins["requests"]), (2, 32, 4))


if __name__ == "__main__":
    unittest.main()
'''


def suite_argv(python: str = sys.executable) -> list[str]:
    return [python, "-m", "unittest", "discover", "-s", "tests", "-t", "."]


def verify_commands(python: str = sys.executable) -> list[str]:
    """The harness's verifiers, named as their evidence is filed: the test suite
    (``unit_tests``) and the security check (``security``), as shell command lines."""
    return [
        f"unit_tests={shlex.join(suite_argv(python))}",
        f"security={shlex.join([python, 'check_security.py'])}",
    ]


# The demo's own policy: the two programs its agent runs are allowed by name, so the
# demo also completes where no OS sandbox confines commands (auto mode then asks).
DEMO_POLICY = """\
[[rule]]
action = "allow"
tool = "run_command"
argv = "python* check_security.py"
reason = "the demo's security check"

[[rule]]
action = "allow"
tool = "run_command"
argv = "python* -m unittest discover*"
reason = "the demo's test suite"
"""


def write_policy(path: Path) -> Path:
    """The demo's policy file (outside the workspace, passed as ``--policy``)."""
    path.write_text(DEMO_POLICY, encoding="utf-8")
    return path


def prepare_workspace(target: Path) -> Path:
    """Copy the sample service into ``target`` (new or empty) and commit it to git.

    Without git on PATH the copy is still made; the run then has no diff artifact.
    """
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"{target} is not empty; give the demo a new or empty directory")
    shutil.copytree(SAMPLE, target, ignore=_IGNORED, dirs_exist_ok=True)
    if shutil.which("git") is None:
        return target
    identity = ["-c", "user.name=Keel demo", "-c", "user.email=demo@keel.invalid"]
    for argv in (
        ["git", "init", "--quiet"],
        ["git", "add", "--all"],
        ["git", *identity, "commit", "--quiet", "--no-gpg-sign", "-m", "inventory service"],
    ):
        done = subprocess.run(argv, cwd=target, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"`{shlex.join(argv)}` failed in {target}: {done.stderr.strip()}")
    return target


def remediation_turns(python: str = sys.executable) -> list[dict[str, Any]]:
    """The scripted model's turns, in the ``scripted:`` format (SPEC.md, "Models")."""
    todos = [
        "Move requests to a release without known advisories",
        "Add a regression test for the pin",
        "Run the test suite",
    ]

    def todo_turn(done: int, text: str) -> dict[str, Any]:
        listed = [
            {
                "content": item,
                "status": "completed" if i < done else "in_progress" if i == done else "pending",
            }
            for i, item in enumerate(todos)
        ]
        return {"content": text, "tool_calls": [call("todo_write", todos=listed)]}

    return [
        {
            "content": "First I read the dependency manifest and the code that uses it.",
            "tool_calls": [
                call("read_file", path="requirements.txt"),
                call("read_file", path="inventory/client.py"),
                call("read_file", path="check_security.py"),
            ],
        },
        {
            "content": "Let me see what the security check reports for the current pins.",
            "tool_calls": [call("run_command", argv=[python, "check_security.py"])],
        },
        todo_turn(0, "requests 2.19.1 has four advisories; 2.32.4 fixes all of them. My plan:"),
        {
            "content": "Bumping the pin.",
            "tool_calls": [
                call(
                    "edit_file",
                    path="requirements.txt",
                    old_text=VULNERABLE_PIN,
                    new_text=FIXED_PIN,
                )
            ],
        },
        todo_turn(1, "Pin moved. Now a regression test so the old pin cannot come back."),
        {
            "content": "Writing the regression test.",
            "tool_calls": [
                call("write_file", path="tests/test_dependencies.py", content=REGRESSION_TEST)
            ],
        },
        todo_turn(2, "Test added. Running the whole suite."),
        {
            "content": "Running the tests.",
            "tool_calls": [call("run_command", argv=[*suite_argv(python), "-v"])],
        },
        todo_turn(3, "All green."),
        {
            "content": "Done: asking the harness to verify.",
            "tool_calls": [
                call(
                    "request_completion",
                    summary=f"Moved {VULNERABLE_PIN} to {FIXED_PIN} (fixes CVE-2018-18074, "
                    "CVE-2023-32681, CVE-2024-35195, CVE-2024-47081) and added "
                    "tests/test_dependencies.py so a vulnerable pin fails the suite.",
                )
            ],
        },
    ]


def write_script(path: Path, python: str = sys.executable) -> Path:
    """Store the turns where ``scripted:PATH`` (and so ``keel resume``) can read them."""
    path.write_text(json.dumps(remediation_turns(python), indent=2), encoding="utf-8")
    return path


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}
