"""`[sandbox]` in .keel/config.toml and `--sandbox`: every broken value is one precise line.

Real config files on disk and the real `keel` command; nothing is stored when refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keel.core.errors import ConfigError
from keel.runtime.config import load_sandbox_settings, settings_from_dict
from keel.testing.cli import DONE, KeelWorkspace, one_line_error


def write_config(root: Path, text: str) -> None:
    (root / ".keel").mkdir(exist_ok=True)
    (root / ".keel" / "config.toml").write_text(text)


def test_settings_are_read_from_the_workspace_config_and_the_flag_wins(tmp_path: Path) -> None:
    write_config(
        tmp_path,
        '[sandbox]\nmode = "off"\nnetwork = true\nenv = ["NPM_TOKEN"]\nprocesses = 64\n'
        'orphans = "kill"\n',
    )
    settings = load_sandbox_settings(tmp_path)
    assert (settings.mode, settings.network, settings.env) == ("off", True, ("NPM_TOKEN",))
    assert (settings.processes, settings.orphans) == (64, "kill")
    assert load_sandbox_settings(tmp_path, mode="required").mode == "required"
    assert settings_from_dict(settings.to_dict()) == settings  # stored with the run as is


def test_no_config_file_means_the_defaults(tmp_path: Path) -> None:
    settings = load_sandbox_settings(tmp_path)
    assert (settings.mode, settings.network, settings.orphans) == ("auto", False, "wait")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[sandbox]\nmode = "sometimes"\n', "unknown sandbox mode 'sometimes'"),
        ("[sandbox]\nmode = 1\n", "mode must be a string"),
        ('[sandbox]\nnetwork = "yes"\n', "network must be true or false"),
        ('[sandbox]\nenv = "NPM_TOKEN"\n', "env must be a list"),
        ('[sandbox]\nread_only = [""]\n', "read_only must be a list of non-empty strings"),
        ("[sandbox]\nprocesses = 0\n", "processes must be a positive whole number"),
        ("[sandbox]\nmemory_mb = -5\n", "memory_mb must be a positive whole number"),
        ("[sandbox]\ncpu_seconds = 1.5\n", "cpu_seconds must be a positive whole number"),
        ("[sandbox]\nfile_size_mb = true\n", "file_size_mb must be a positive whole number"),
        ('[sandbox]\norphans = "ignore"\n', "orphans must be 'wait' or 'kill'"),
        ("[sandbox]\nnetwrok = true\n", "unknown sandbox setting 'netwrok'"),
        ('sandbox = "off"\n', "'sandbox' must be a table"),
        ("[sandbox\n", "cannot read the configuration"),
    ],
)
def test_a_broken_setting_names_the_file_and_what_to_fix(
    tmp_path: Path, text: str, words: str
) -> None:
    write_config(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_sandbox_settings(tmp_path)
    assert words in str(caught.value)
    assert "config.toml" in str(caught.value)


def test_keel_run_refuses_a_broken_sandbox_setting_before_storing_anything(
    tmp_path: Path,
) -> None:
    ws = KeelWorkspace(tmp_path)
    model = ws.script(DONE)
    line = one_line_error(ws.keel("run", "x", "--model", model, "--sandbox", "maybe"))
    assert "unknown sandbox mode 'maybe'" in line and "required|auto|off" in line
    write_config(tmp_path, "[sandbox]\nprocesses = -1\n")
    line = one_line_error(ws.keel("run", "x", "--model", model))
    assert "processes must be a positive whole number" in line
    listed = ws.keel("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []  # no run was stored
