"""The warehouse API client: the only code that uses ``requests``."""

from __future__ import annotations

from typing import Any

WAREHOUSE_URL = "https://warehouse.example.invalid/api"


def fetch_levels(token: str, base_url: str = WAREHOUSE_URL) -> dict[str, Any]:
    """Stock levels from the warehouse; the bearer token must never leave that host."""
    import requests  # noqa: PLC0415 (here, so the rest of the service works without it)

    response = requests.get(
        f"{base_url}/levels", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    response.raise_for_status()
    levels: dict[str, Any] = response.json()
    return levels
