"""The model a run is driven by: chosen from the harness's and the run's, priced when it
has a cost budget, recorded to a cassette when asked, a ``scripted:`` path made absolute
so a resume elsewhere finds it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from keel.core.budget import Budget
from keel.core.errors import ConfigError
from keel.core.state import RunState
from keel.loop.driver import Driver
from keel.models.base import Model, price_known
from keel.models.resolve import resolve_model

# Providers whose models are stateless (one shared HTTP client each): resolved once per
# (spec, working directory) and process. A scripted or replayed model keeps per-run state
# (what it was asked), so it is made afresh for every run.
SHARED_MODEL_PROVIDERS = frozenset({"deepseek", "openai"})
NO_MODEL = "no model for this run: pass --model SPEC or set KEEL_MODEL"


class RunModels:
    """The models one harness drives runs with: its own (a ``Model`` object or a spec),
    else each run's stored spec, else ``KEEL_MODEL``."""

    def __init__(self, model: str | Model | None) -> None:
        self.given = model
        self._shared: dict[tuple[str, str], Model] = {}
        self._lock = threading.Lock()

    @property
    def fixed(self) -> Model | None:
        """The ``Model`` object every run is driven by, when the harness was given one."""
        return None if self.given is None or isinstance(self.given, str) else self.given

    def spec_for(self, explicit: str | None) -> str | None:
        """The spec a new run stores: the call's, the harness's, else ``KEEL_MODEL``."""
        if explicit:
            return absolute_scripted(explicit)
        if self.fixed is not None:
            return self.fixed.spec
        spec = self.given or os.environ.get("KEEL_MODEL")
        return absolute_scripted(str(spec)) if spec else None

    def check(self, spec: str | None, budget: Budget, *, queued: bool) -> None:
        """Refuse, before anything is written, a run this process cannot drive (no model,
        a missing API key) or whose cost budget cannot be priced.

        A queued run is driven by a worker: its model is only checked for a price when
        it resolves here (the worker checks the rest)."""
        if self.fixed is not None:
            check_priced(self.fixed, budget)
            return
        if queued:
            if spec and budget.max_cost is not None:
                try:
                    model = self.resolve(spec)
                except ConfigError:
                    return
                check_priced(model, budget)
            return
        if not spec:
            raise ConfigError(NO_MODEL)
        check_priced(self.resolve(spec), budget)

    def for_run(self, state: RunState) -> Model:
        spec = state.options.model
        fixed = self.fixed
        if fixed is not None:
            if state.options.agent is None or spec is None or spec == fixed.spec:
                return fixed
            return self.resolve(spec)  # a child whose agent spec names its own model
        if not spec:
            raise ConfigError(NO_MODEL)
        return self.resolve(spec)

    def resolve(self, spec: str) -> Model:
        """The model ``spec`` names; a stateless provider model is made once per process
        and working directory, and shared by every run (and worker slot) after."""
        cwd = Path.cwd()
        if spec.partition(":")[0].strip() not in SHARED_MODEL_PROVIDERS:
            return resolve_model(spec, cwd=cwd)
        key = (spec, str(cwd))
        with self._lock:
            model = self._shared.get(key)
            if model is None:
                model = self._shared[key] = resolve_model(spec, cwd=cwd)
        return model


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
