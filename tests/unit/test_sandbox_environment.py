"""The scrubbed environment of confined programs: an allowlist, never a secret by accident."""

from __future__ import annotations

from keel.sandbox.environment import scrubbed_environment

HOST = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "TERM": "xterm",
    "HOME": "/home/me",
    "TMPDIR": "/var/tmp/me",
    "OPENAI_API_KEY": "sk-abc123abc123",
    "NPM_TOKEN": "npm_secret_value",
    "DATABASE_URL": "postgres://app:hunter2hunter2@db/app",
    "EDITOR": "vim",
    "SSH_AUTH_SOCK": "/run/user/1000/ssh-agent",
    "LC_SECRET_THING": "x",
}


def test_only_the_allowlist_passes_with_home_and_tmpdir_inside() -> None:
    env = scrubbed_environment(HOST, home="/tmp/home", tmpdir="/tmp")
    assert env == {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TERM": "xterm",
        "HOME": "/tmp/home",
        "TMPDIR": "/tmp",
    }


def test_names_the_settings_pass_are_kept_even_when_secret_looking() -> None:
    env = scrubbed_environment(
        HOST, passed=("NPM_TOKEN", "EDITOR", "ABSENT"), home="/h", tmpdir="/t"
    )
    assert env["NPM_TOKEN"] == "npm_secret_value" and env["EDITOR"] == "vim"
    assert "ABSENT" not in env and "OPENAI_API_KEY" not in env


def test_extra_variables_are_set_exactly_and_win() -> None:
    env = scrubbed_environment(
        HOST, home="/h", tmpdir="/t", extra={"GIT_CONFIG_NOSYSTEM": "1", "HOME": "/empty"}
    )
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["HOME"] == "/empty"


def test_a_missing_path_gets_a_usable_default() -> None:
    env = scrubbed_environment({}, home="/h", tmpdir="/t")
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
