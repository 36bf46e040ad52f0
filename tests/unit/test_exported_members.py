"""The front door: `keel` exports exactly its public names, sorted, all importable."""

from __future__ import annotations

import keel


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert keel.__all__ == sorted(keel.__all__)
    for name in keel.__all__:
        assert getattr(keel, name) is not None


def test_no_public_name_is_left_out_of_all() -> None:
    # dir(), not vars(): the names are loaded on first use (keel.__getattr__)
    public = {
        name
        for name in dir(keel)
        if not name.startswith("_")
        and not getattr(getattr(keel, name), "__name__", "").startswith("keel.")
    }
    assert public == set(keel.__all__)
