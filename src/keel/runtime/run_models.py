"""The model a run is driven by: priced when it has a cost budget, recorded to a cassette
when asked, a ``scripted:`` path made absolute so a resume elsewhere finds it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.loop.driver import Driver
from keel.models.base import Model, price_known


def check_priced(model: Model, budget: Budget) -> None:
    """ConfigError when ``budget`` limits cost but ``model``'s turns would cost 0 for want
    of a price: the limit would never bite. The message names the table to add."""
    if budget.max_cost is None or price_known(model):
        return
    raise ConfigError(
        f"a cost budget (--max-cost, max_cost) needs a price for {model.spec}, and Keel "
        f'has none: add [prices."{model.spec}"] with input_per_mtok and output_per_mtok '
        f"(USD per million tokens) to .keel/config.toml in {Path.cwd()}, or drop the cost "
        "budget"
    )


def check_record(record: str | Path, *, queued: bool) -> None:
    """ConfigError unless a cassette can be written at ``record`` by this process."""
    if queued:
        raise ConfigError(
            "--record cannot be used with --detach: recording happens in the process "
            "that talks to the model; run without --detach to record"
        )
    path = Path(record)
    if path.is_dir():
        raise ConfigError(f"--record {path}: is a directory; give a file name")


class RunRedaction:
    """The run's redactor as it is at each call: the driver learns secrets as it goes
    (a written .env), and a cassette must not keep what the log does not."""

    def __init__(self) -> None:
        self.driver: Driver | None = None

    def __call__(self, text: str) -> str:
        if self.driver is None:
            return text
        return self.driver.redactor.scrub_text(text)


def recording(model: Model, path: Path, redact: Callable[[str], str]) -> Model:
    """``model`` writing every exchange to the cassette at ``path``."""
    from keel.models.cassette import RecordingModel  # noqa: PLC0415 - only when recording

    return RecordingModel(model, path, redact=redact)


def absolute_scripted(spec: str) -> str:
    """``scripted:PATH`` with PATH made absolute, so a resume elsewhere finds it."""
    if spec.startswith("scripted:"):
        return "scripted:" + str(Path(spec.removeprefix("scripted:")).resolve())
    return spec
