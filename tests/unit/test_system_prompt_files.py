"""The system prompt's list of changed files: every one while few, bounded when many.

The prompt goes with every request, so a run that wrote a thousand files must not send a
thousand lines each step; the model still learns how many changed and which came last.
"""

from __future__ import annotations

from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.loop.prepare import CHANGED_SHOWN, system_prompt


def state_with(paths: list[str]) -> RunState:
    return RunState(
        run_id="run_x",
        goal="g",
        workspace="/ws",
        options=RunOptions(),
        changed_files={p: "0" * 64 for p in paths},
        mutation_revision=len(paths),
    )


def listed(prompt: str) -> list[str]:
    lines = prompt.split("Files changed so far")[1].splitlines()[1:]
    return [line.strip() for line in lines if line.startswith("  ")]


def test_a_few_changed_files_are_all_listed_sorted() -> None:
    prompt = system_prompt(state_with(["b.py", "a.py", "c/d.py"]))
    assert "(mutation revision 3)" in prompt
    assert listed(prompt) == ["a.py", "b.py", "c/d.py"]


def test_many_changed_files_list_the_latest_and_count_the_rest() -> None:
    paths = [f"notes/{i:04d}.txt" for i in range(CHANGED_SHOWN + 25)]
    shown = listed(system_prompt(state_with(paths)))
    assert shown[0].startswith("… 25 earlier ones")
    assert shown[1:] == sorted(paths[-CHANGED_SHOWN:])  # the most recent, by name
    # Exactly at the bound nothing is left out.
    assert listed(system_prompt(state_with(paths[:CHANGED_SHOWN]))) == sorted(paths[:CHANGED_SHOWN])
