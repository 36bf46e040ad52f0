"""The mutation report (``make mutate``): every mutant of the target modules, by module.

mutmut (configured in ``[tool.mutmut]`` of pyproject.toml) leaves its verdicts in
``mutants/**/*.py.meta``; this script reads them and writes ``bench/mutation/report.md``:
per module the mutants, killed, timeouts (killed too: the mutant hung), survivors no
test kills, the survivors listed in ``bench/mutation/equivalent/MODULE.toml`` as equivalent
(no behaviour changes; each with its reason), the ones no selected test runs, and those
not yet tried. Then every equivalent mutant with its reason, every survivor still to be
killed or explained (its diff), and the stale entries of the equivalents file: an entry
matching no mutant any more (the line changed), or matching one a test now kills.

An equivalent mutant is named by module, function and the mutated lines before and
after (``original``, ``mutant``), not by mutmut's numbered id, which shifts whenever the
function is edited.

A function that only runs while its module is imported (building a module-level table)
cannot be tested the way mutmut tests: it switches a mutant on in a process that imported
the module already. ``--fresh`` tries each survivor of the functions listed in
``bench/mutation/import_time.toml`` in a new pytest process that imports the mutated
module with the mutant on, running the tests named there; those it kills are counted
"killed on import" (``mutants/fresh.json`` keeps the verdicts).

``--reset`` marks the survivors and the mutants no test ran as not tried, so that the next
``mutmut run`` tries them with the current tests: mutmut keeps a verdict until the
function changes, so a new test would kill nothing until its mutant is tried again.
(mutmut learns which tests run a function when a test is new; a test changed to run
more functions is only seen by a fresh run: remove mutants/ first.)

Usage: python bench/mutation/report.py [--reset | --fresh] [--out bench/mutation/report.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EQUIVALENT = HERE / "equivalent"  # one TOML file per module
IMPORT_TIME = HERE / "import_time.toml"
REPORT = HERE / "report.md"

# mutmut's exit codes, as its stats module reads them.
STATUS = {
    None: "not checked",
    0: "survived",
    1: "killed",
    3: "killed",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "type check",
}
RETRIED = ("survived", "no tests")
COLUMNS = (
    "mutants",
    "killed",
    "timeout",
    "killed on import",
    "survived",
    "equivalent",
    "no tests",
    "not checked",
)


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's id, e.g. keel.core.budget.xǁBudgetǁcheck__mutmut_3
    path: str  # src/keel/core/budget.py
    module: str
    function: str  # Budget.check
    status: str


@dataclass(frozen=True)
class Entry:
    module: str
    function: str
    original: str
    mutant: str
    reason: str

    def key(self) -> tuple[str, str, str, str]:
        return (self.module, self.function, self.original, self.mutant)


def function_of(name: str) -> str:
    """``Class.method`` or ``function`` from a mutant id."""
    mangled = name.partition("__mutmut_")[0].rpartition(".")[2]
    if "ǁ" in mangled:
        _, cls, method = mangled.split("ǁ")
        return f"{cls}.{method}"
    return mangled.removeprefix("x_")


def load_mutants(root: Path) -> list[Mutant]:
    found = []
    for meta in sorted((root / "mutants").rglob("*.py.meta")):
        source = meta.relative_to(root / "mutants").as_posix().removesuffix(".meta")
        module = source.removeprefix("src/").removesuffix(".py").replace("/", ".")
        try:
            codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        except (ValueError, KeyError):  # a mutmut run killed while it wrote the file
            print(f"{meta}: unreadable, {module}'s verdicts are lost: remove it, run again")
            continue
        for name, code in codes.items():
            status = STATUS.get(code, "suspicious")
            found.append(Mutant(name, source, module, function_of(name), status))
    return found


def reset_survivors(root: Path) -> int:
    """Mark the survivors (and the mutants no test ran) as not tried; how many there were."""
    from mutmut.mutation.data import SourceFileMutationData  # noqa: PLC0415

    os.chdir(root)  # mutmut reads mutants/ relative to the working directory
    count = 0
    for meta in sorted((root / "mutants").rglob("*.py.meta")):
        data = SourceFileMutationData(path=meta.relative_to(root / "mutants").as_posix()[:-5])
        data.load()
        codes = data.exit_code_by_key
        again = [name for name, code in codes.items() if STATUS.get(code) in RETRIED]
        if again:
            codes.update(dict.fromkeys(again))
            data.save()
            count += len(again)
    return count


def changed_lines(mutant: Mutant, root: Path) -> tuple[str, str]:
    """The mutated lines, before and after, stripped: the mutant's name in the report."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant  # noqa: PLC0415

    diff = get_diff_for_mutant(mutant.name, path=mutant.path)
    before = [line[1:].strip() for line in diff.splitlines()[2:] if line.startswith("-")]
    after = [line[1:].strip() for line in diff.splitlines()[2:] if line.startswith("+")]
    return "\n".join(before), "\n".join(after)


def load_equivalents(path: Path) -> list[Entry]:
    """The entries of ``path``: a TOML file, or a folder of them (one per module)."""
    files = sorted(path.glob("*.toml")) if path.is_dir() else [path] if path.exists() else []
    items = []
    for file in files:
        items += tomllib.loads(file.read_text(encoding="utf-8")).get("equivalent", [])
    entries = []
    for item in items:
        entries.append(
            Entry(
                item["module"],
                item["function"],
                item["original"].strip(),
                item["mutant"].strip(),
                " ".join(item["reason"].split()),
            )
        )
    return entries


def quoted(text: str) -> str:
    return "<br>".join(f"`{line}`" if line else "(nothing)" for line in text.split("\n"))


def import_time_functions(path: Path) -> dict[tuple[str, str], tuple[str, ...]]:
    """(module, function) -> the tests that exercise what the function builds."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {
        (item["module"], item["function"]): tuple(item["tests"])
        for item in data.get("function", [])
    }


def try_fresh(root: Path, listed: Path) -> dict[str, int]:
    """Run each survivor of an import-time function in a fresh pytest process (the mutant
    switched on before the import); its exit code by mutant id, also kept in
    mutants/fresh.json."""
    functions = import_time_functions(listed)
    verdicts: dict[str, int] = {}
    env = {**os.environ, "PYTHONPATH": str(root / "mutants" / "src")}
    for mutant in load_mutants(root):
        tests = functions.get((mutant.module, mutant.function))
        if tests is None or mutant.status != "survived":
            continue
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        done = subprocess.run(
            command,
            cwd=root / "mutants",
            env={**env, "MUTANT_UNDER_TEST": mutant.name},
            capture_output=True,
            check=False,
        )
        verdicts[mutant.name] = done.returncode
        print(f"{mutant.name}: {'killed' if done.returncode == 1 else 'survived'}")
    (root / "mutants" / "fresh.json").write_text(json.dumps(verdicts, indent=1), encoding="utf-8")
    return verdicts


def write_report(root: Path, out: Path, equivalents_path: Path) -> dict[str, Counter[str]]:
    os.chdir(root)  # mutmut reads mutants/ relative to the working directory
    fresh_file = root / "mutants" / "fresh.json"
    fresh = json.loads(fresh_file.read_text(encoding="utf-8")) if fresh_file.exists() else {}
    mutants = load_mutants(root)
    entries = load_equivalents(equivalents_path)
    by_key: dict[tuple[str, str, str, str], Entry] = {entry.key(): entry for entry in entries}
    used: dict[tuple[str, str, str, str], list[Mutant]] = defaultdict(list)

    named = {(entry.module, entry.function) for entry in entries}
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    equivalent: list[tuple[Mutant, Entry]] = []
    survivors: list[tuple[Mutant, str, str]] = []
    for mutant in mutants:
        row = counts[mutant.module]
        row["mutants"] += 1
        if mutant.status not in ("survived", "no tests", "killed", "timeout"):
            row[mutant.status if mutant.status in COLUMNS else "not checked"] += 1
            continue
        if mutant.status == "survived" and fresh.get(mutant.name) == 1:
            row["killed on import"] += 1  # a test failed once the import ran the mutant
            continue
        if mutant.status in ("killed", "timeout") and (mutant.module, mutant.function) not in named:
            row[mutant.status] += 1  # its diff is only needed to see an entry gone stale
            continue
        before, after = changed_lines(mutant, root)
        key = (mutant.module, mutant.function, before, after)
        if key in by_key:
            used[key].append(mutant)
        if mutant.status in ("killed", "timeout"):
            row[mutant.status] += 1
        elif key in by_key:
            row["equivalent"] += 1
            equivalent.append((mutant, by_key[key]))
        else:
            row[mutant.status] += 1
            survivors.append((mutant, before, after))

    untried = {
        (m.module, m.function)
        for m in mutants
        if m.status not in ("survived", "no tests", "killed", "timeout")
    }
    stale = []
    waiting = 0  # entries whose function still has mutants not tried: no verdict yet
    for entry in entries:
        matched = used.get(entry.key(), [])
        if not matched and (entry.module, entry.function) in untried:
            waiting += 1
        elif not matched:
            stale.append((entry, "matches no mutant (the code changed)"))
        elif all(m.status in ("killed", "timeout") for m in matched):
            stale.append((entry, "a test kills it now"))

    total: Counter[str] = Counter()
    for row in counts.values():
        total.update(row)

    lines = [
        "# Mutation testing report",
        "",
        "Written by `make mutate` (mutmut, configured in `[tool.mutmut]` of pyproject.toml;",
        "this file by `bench/mutation/report.py`). Do not edit: explain an equivalent mutant",
        "in `bench/mutation/equivalent/MODULE.toml`, kill any other survivor with a test.",
        "",
        "Killed: a selected test failed; timeout: the mutant hung (killed too); killed on",
        "import: a function run only while its module is imported, killed in a fresh process",
        "(`bench/mutation/import_time.toml`); survived: no test notices it; equivalent:",
        "survives because nothing observable changes (the reason is below); no tests: no",
        "selected test runs the function.",
        "",
        "| module | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for module in sorted(counts):
        lines.append(f"| {module} | " + " | ".join(str(counts[module][c]) for c in COLUMNS) + " |")
    lines.append("| **total** | " + " | ".join(f"**{total[c]}**" for c in COLUMNS) + " |")
    lines += ["", f"## Survivors to kill or explain ({len(survivors)})", ""]
    if not survivors:
        lines.append("None.")
    current = None
    for mutant, before, after in sorted(survivors, key=lambda s: (s[0].module, s[0].name)):
        if mutant.module != current:
            current = mutant.module
            lines += ["", f"### {current}", ""]
        lines.append(
            f"- `{mutant.function}` ({mutant.status}, `{mutant.name.rpartition('.')[2]}`): "
            f"{quoted(before)} → {quoted(after)}"
        )
    lines += ["", f"## Equivalent mutants ({len(equivalent)})", ""]
    if not equivalent:
        lines.append("None.")
    current = None
    for mutant, entry in sorted(equivalent, key=lambda e: (e[0].module, e[0].name)):
        if mutant.module != current:
            current = mutant.module
            lines += ["", f"### {current}", ""]
        lines.append(
            f"- `{mutant.function}`: {quoted(entry.original)} → {quoted(entry.mutant)}: "
            f"{entry.reason}"
        )
    lines += ["", f"## Stale entries in equivalent/ ({len(stale)})", ""]
    if waiting:
        lines += [
            f"({waiting} more entries name mutants of functions not yet fully tried: "
            "they are judged once the run tries them.)",
            "",
        ]
    if not stale:
        lines.append("None.")
    for entry, why in stale:
        lines.append(
            f"- {entry.module} `{entry.function}`: {quoted(entry.original)} → "
            f"{quoted(entry.mutant)}: {why}"
        )
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    counts["total"] = total
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reset", action="store_true", help="try the survivors again next run")
    parser.add_argument("--fresh", action="store_true", help="try import-time survivors")
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--equivalent", type=Path, default=EQUIVALENT)
    args = parser.parse_args()
    if not (ROOT / "mutants").is_dir():
        sys.exit("no mutants/: run `make mutate` (mutmut run) first")
    if args.reset:
        print(f"{reset_survivors(ROOT)} survivors to try again")
        return
    if args.fresh:
        verdicts = try_fresh(ROOT, IMPORT_TIME)
        killed = sum(code == 1 for code in verdicts.values())
        print(f"{killed} of {len(verdicts)} import-time survivors killed in a fresh process")
        return
    counts = write_report(ROOT, args.out.resolve(), args.equivalent.resolve())
    total = counts["total"]
    killed = total["killed"] + total["timeout"] + total["killed on import"]
    print(
        f"{args.out}: {total['mutants']} mutants, {killed} killed ({total['timeout']} by "
        f"timeout, {total['killed on import']} on import), {total['equivalent']} equivalent, "
        f"{total['survived'] + total['no tests']} to kill or explain, "
        f"{total['not checked']} not tried"
    )


if __name__ == "__main__":
    main()
