"""The PATH a program is looked up in once a wrapper clears it (``env -i``, ``command -p``):
the system's default (``confstr(CS_PATH)``), or ``/bin:/usr/bin`` when it names none."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from keel.policy.commands import normalise_command


def test_a_cleared_path_is_the_default_the_system_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system_bin = tmp_path / "system-bin"
    system_bin.mkdir()
    (tmp_path / "realtool").write_text("#!/bin/sh\n")
    (tmp_path / "realtool").chmod(0o755)
    (system_bin / "tool").symlink_to(tmp_path / "realtool")

    def confstr(name: str) -> str:
        if name == "CS_PATH":
            return str(system_bin)
        raise ValueError("unrecognized configuration name")

    monkeypatch.setattr(os, "confstr", confstr)
    for wrapped in (["env", "-i"], ["command", "-p"]):
        [form] = normalise_command([*wrapped, "tool", "x"], cwd=tmp_path, path="").forms
        assert form.normal == ("realtool", "x")


@pytest.mark.parametrize("answer", ["", ValueError("unrecognized configuration name")])
def test_a_cleared_path_is_bin_and_usr_bin_when_the_system_names_none(
    answer: str | Exception, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sh = shutil.which("sh", path="/bin:/usr/bin")
    real = os.path.basename(os.path.realpath(sh)) if sh is not None else "sh"
    if real == "sh":
        pytest.skip("needs /bin/sh or /usr/bin/sh to be a link to a shell of another name")

    def confstr(name: str) -> str:
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(os, "confstr", confstr)
    [form] = normalise_command(["env", "-i", "sh", "x.sh"], cwd=tmp_path, path="").forms
    assert form.normal == (real, "x.sh")
