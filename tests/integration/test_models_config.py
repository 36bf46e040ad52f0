"""Choosing and configuring a model from files: spec strings, .env, .keel/config.toml,
script files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.core.errors import ConfigError, ModelError
from keel.models.base import Message, ModelRequest
from keel.models.cassette import RecordingModel, ReplayModel
from keel.models.connections import close_shared_clients
from keel.models.openai_compat import OpenAICompatModel
from keel.models.pricing import BUILTIN_PRICES, load_price_table
from keel.models.profiles import DEEPSEEK, OPENAI, OPENAI_COMPATIBLE
from keel.models.resolve import resolve_model
from keel.models.scripted import ScriptedModel
from keel.runtime.takeover import lease_ttl_from_environment
from keel.testing.provider import FakeProvider


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    """Each test's adapters start from no pooled connection and leave none behind."""
    close_shared_clients()
    yield
    close_shared_clients()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


def hello(step: int = 0) -> ModelRequest:
    return ModelRequest(messages=(Message(role="user", content="hi"),), tools=(), step=step)


# --- spec strings ------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["deepseek", "deepseek:", ":gpt-4o", "gpt-4o", ""])
def test_malformed_spec_lists_the_accepted_forms(tmp_path: Path, spec: str) -> None:
    with pytest.raises(ConfigError, match="malformed model spec") as err:
        resolve_model(spec, cwd=tmp_path, environ={})
    assert "deepseek:MODEL" in str(err.value)
    assert "scripted:PATH" in str(err.value)


def test_unknown_provider_lists_the_accepted_forms(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown model provider 'anthropic'") as err:
        resolve_model("anthropic:claude", cwd=tmp_path, environ={})
    assert "openai:MODEL" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "variable"),
    [("deepseek:deepseek-chat", "DEEPSEEK_API_KEY"), ("openai:gpt-4o", "OPENAI_API_KEY")],
)
def test_missing_key_names_the_variable_to_set(tmp_path: Path, spec: str, variable: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_model(spec, cwd=tmp_path, environ={variable: "  "})
    assert f"set {variable} (in the environment or .env)" in str(err.value)


def test_default_base_urls_are_the_providers(tmp_path: Path) -> None:
    deepseek = resolve_model(
        "deepseek:deepseek-chat", cwd=tmp_path, environ={"DEEPSEEK_API_KEY": "sk-secret-1"}
    )
    openai = resolve_model("openai:gpt-4o", cwd=tmp_path, environ={"OPENAI_API_KEY": "k"})
    assert isinstance(deepseek, OpenAICompatModel)
    assert isinstance(openai, OpenAICompatModel)
    assert deepseek.endpoint == "https://api.deepseek.com/chat/completions"
    assert openai.endpoint == "https://api.openai.com/v1/chat/completions"
    assert "sk-secret-1" not in repr(deepseek)


@pytest.mark.parametrize(
    ("spec", "environ", "profile"),
    [
        ("deepseek:deepseek-chat", {"DEEPSEEK_API_KEY": "k"}, DEEPSEEK),
        ("openai:gpt-4o", {"OPENAI_API_KEY": "k"}, OPENAI),
        (
            "openai:qwen3",
            {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://localhost:8000/v1"},
            OPENAI_COMPATIBLE,
        ),
    ],
)
def test_the_provider_profile_follows_the_spec_and_base_url(
    tmp_path: Path, spec: str, environ: dict[str, str], profile: object
) -> None:
    model = resolve_model(spec, cwd=tmp_path, environ=environ)
    assert isinstance(model, OpenAICompatModel)
    assert model.profile is profile


# --- .env --------------------------------------------------------------------------------


def test_dotenv_in_the_working_directory_configures_the_provider(
    tmp_path: Path, provider: FakeProvider
) -> None:
    (tmp_path / ".env").write_text(
        f"DEEPSEEK_API_KEY=sk-from-dotenv\nDEEPSEEK_BASE_URL={provider.base_url}\n"
    )
    provider.reply(content="hello", usage=(1_000_000, 1_000_000))

    model = resolve_model("deepseek:deepseek-chat", cwd=tmp_path, environ={})
    turn = model.complete(hello())

    assert turn.content == "hello"
    assert provider.headers[0]["authorization"] == "Bearer sk-from-dotenv"
    assert provider.requests[0]["model"] == "deepseek-chat"
    price = BUILTIN_PRICES["deepseek:deepseek-chat"]
    assert turn.cost == pytest.approx(price.input_per_mtok + price.output_per_mtok)


def test_a_variable_already_set_wins_over_dotenv(tmp_path: Path, provider: FakeProvider) -> None:
    (tmp_path / ".env").write_text(
        f"OPENAI_API_KEY=sk-from-dotenv\nOPENAI_BASE_URL={provider.base_url}\n"
    )
    provider.reply(content="ok")
    model = resolve_model("openai:gpt-4o", cwd=tmp_path, environ={"OPENAI_API_KEY": "sk-env"})
    model.complete(hello())
    assert provider.headers[0]["authorization"] == "Bearer sk-env"


def test_retry_settings_come_from_the_environment(tmp_path: Path, provider: FakeProvider) -> None:
    provider.fail(500, "boom").fail(500, "boom").reply(content="too late")
    environ = {
        "OPENAI_API_KEY": "k",
        "OPENAI_BASE_URL": provider.base_url,
        "KEEL_MODEL_MAX_ATTEMPTS": "2",
        "KEEL_MODEL_MAX_WAIT": "0.01",
        "KEEL_MODEL_TIMEOUT": "0.5",
    }
    model = resolve_model("openai:gpt-4o", cwd=tmp_path, environ=environ)
    assert isinstance(model, OpenAICompatModel)
    assert model.max_answer_seconds == 1800.0  # the default bound on one attempt
    with pytest.raises(ModelError, match="gave up after 2 attempt"):
        model.complete(hello())
    assert len(provider.requests) == 2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KEEL_MODEL_MAX_ATTEMPTS", "lots"),
        ("KEEL_MODEL_MAX_ATTEMPTS", "0"),
        ("KEEL_MODEL_TIMEOUT", "-1"),
        ("KEEL_MODEL_TIMEOUT", "nan"),
        ("KEEL_MODEL_MAX_WAIT", "inf"),
        ("KEEL_MODEL_MAX_ANSWER_SECONDS", "0"),
        ("KEEL_MODEL_MAX_ANSWER_SECONDS", "forever"),
    ],
)
def test_a_bad_retry_setting_names_the_variable(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        resolve_model("openai:gpt-4o", cwd=tmp_path, environ={"OPENAI_API_KEY": "k", name: value})


# --- streaming ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "streams"),
    [(None, True), ("1", True), ("on", True), ("0", False), ("false", False), ("OFF", False)],
)
def test_keel_model_stream_turns_streaming_on_and_off(
    tmp_path: Path, provider: FakeProvider, value: str | None, streams: bool
) -> None:
    environ = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": provider.base_url}
    if value is not None:
        environ["KEEL_MODEL_STREAM"] = value
    provider.reply(content="ok")
    assert (
        resolve_model("openai:m", cwd=tmp_path, environ=environ).complete(hello()).content == "ok"
    )
    assert provider.requests[0]["stream"] is streams


def test_keel_model_stream_that_is_not_a_switch_is_refused(tmp_path: Path) -> None:
    environ = {"OPENAI_API_KEY": "k", "KEEL_MODEL_STREAM": "sometimes"}
    with pytest.raises(ConfigError, match="KEEL_MODEL_STREAM='sometimes' must be on or off"):
        resolve_model("openai:m", cwd=tmp_path, environ=environ)


# --- prices in .keel/config.toml ---------------------------------------------------------


def write_config(cwd: Path, text: str) -> Path:
    path = cwd / ".keel" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_config_adds_a_price_for_a_custom_model(tmp_path: Path, provider: FakeProvider) -> None:
    write_config(
        tmp_path,
        '[prices."openai:my-model"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n'
        '[prices."openai:gpt-4o"]\ninput_per_mtok = 0\noutput_per_mtok = 0\n',
    )
    provider.reply(content="a", usage=(1_000_000, 500_000))
    provider.reply(content="b", usage=(1_000_000, 500_000))
    environ = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": provider.base_url}

    mine = resolve_model("openai:my-model", cwd=tmp_path, environ=environ).complete(hello())
    overridden = resolve_model("openai:gpt-4o", cwd=tmp_path, environ=environ).complete(hello())

    assert mine.cost == pytest.approx(2.0)
    assert overridden.cost == 0.0
    assert load_price_table(tmp_path).price_of("deepseek:deepseek-chat") is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[prices\n", "is not valid TOML"),
        ('[prices."openai:x"]\ninput_per_mtok = 1\n', "output_per_mtok must be a finite number"),
        ('[prices."openai:x"]\ninput_per_mtok = nan\noutput_per_mtok = 1\n', "got nan"),
        ('[prices."openai:x"]\ninput_per_mtok = 1\noutput_per_mtok = inf\n', "got inf"),
        ('[prices."openai:x"]\ninput_per_mtok = -1\noutput_per_mtok = 1\n', "0 or more"),
        ('[prices."openai:x"]\ninput_per_mtok = 1\noutput_per_mtok = "2"\n', "output_per_mtok"),
        ('[prices."openai:x"]\ninput = 1\n', "unknown key(s) input"),
        ('[prices."gpt-4o"]\ninput_per_mtok = 1\noutput_per_mtok = 1\n', "must be a model spec"),
    ],
)
def test_a_malformed_price_entry_names_the_file_and_entry(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_price_table(tmp_path)
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_config_without_prices_keeps_the_builtin_table(tmp_path: Path) -> None:
    write_config(tmp_path, '[store]\nurl = "sqlite:///x.db"\n')
    assert load_price_table(tmp_path).price_of("openai:gpt-4o") is not None


# --- script files ----------------------------------------------------------------------


def test_scripted_spec_loads_a_file_relative_to_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "script.json").write_text(json.dumps([{"content": "done"}]))

    model = resolve_model("scripted:demo/script.json", cwd=tmp_path, environ={})

    assert isinstance(model, ScriptedModel)
    assert model.spec == "scripted:demo/script.json"
    assert model.complete(hello()).content == "done"


def test_replay_spec_plays_a_cassette_relative_to_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "rec").mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "recorded answer"}]))
    recorder = RecordingModel(ScriptedModel.from_file(script), tmp_path / "rec" / "run.jsonl")
    recorder.complete(hello())

    model = resolve_model("replay:rec/run.jsonl", cwd=tmp_path, environ={})

    assert isinstance(model, ReplayModel)
    assert model.spec == "replay:rec/run.jsonl"
    assert model.complete(hello()).content == "recorded answer"


def test_missing_script_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.json does not exist"):
        resolve_model("scripted:nope.json", cwd=tmp_path, environ={})


def test_bad_json_script_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('[\n  {"content": "a"},\n  {"content": }\n]\n')
    with pytest.raises(ConfigError) as err:
        ScriptedModel.from_file(path)
    assert str(path) in str(err.value)
    assert "line 3 column 15" in str(err.value)


def test_a_script_that_is_not_a_list_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"content": "done"}')
    with pytest.raises(ConfigError, match="a script is a JSON list of turns, got an object"):
        ScriptedModel.from_file(path)


@pytest.mark.parametrize("value", ["0", "-3", "inf", "nan", "soon"])
def test_a_lease_ttl_that_is_not_a_positive_finite_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("KEEL_LEASE_TTL", value)
    with pytest.raises(ConfigError, match="KEEL_LEASE_TTL"):
        lease_ttl_from_environment()
