"""Fail when requirements.txt pins a version named in advisories.json (standard library only).

Usage: python check_security.py [requirements.txt] [advisories.json]
Exit 0 when no pin is affected, 1 with one line per finding otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def parse_version(text: str) -> tuple[int, ...]:
    """``"2.19.1"`` -> ``(2, 19, 1)``; non-numeric parts count as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in text.strip().split("."))


def read_pins(path: Path) -> dict[str, str]:
    """Package name (lower case) -> pinned version, from ``name==version`` lines."""
    pins = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def findings(requirements: Path, advisories: Path) -> list[str]:
    """One line per (pin, advisory) where the pinned version is below the fixed one."""
    pins = read_pins(requirements)
    found = []
    for advisory in json.loads(advisories.read_text(encoding="utf-8")):
        pinned = pins.get(advisory["package"].lower())
        if pinned and parse_version(pinned) < parse_version(advisory["vulnerable_below"]):
            found.append(
                f"{advisory['package']}=={pinned}: {advisory['id']} "
                f"(fixed in {advisory['vulnerable_below']}): {advisory['summary']}"
            )
    return found


def main(argv: list[str]) -> int:
    requirements = Path(argv[1] if len(argv) > 1 else "requirements.txt")
    advisories = Path(argv[2] if len(argv) > 2 else "advisories.json")
    found = findings(requirements, advisories)
    for line in found:
        print(f"VULNERABLE {line}")
    if found:
        print(f"{len(found)} known advisory(ies) affect the pinned dependencies")
        return 1
    print(f"ok: no known advisory affects {requirements}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
