"""Stock levels and reservations."""

from __future__ import annotations


class OutOfStock(Exception):
    """A reservation asked for more than is available."""


class Stock:
    """Items on hand and reserved, per SKU."""

    def __init__(self, on_hand: dict[str, int] | None = None) -> None:
        self.on_hand: dict[str, int] = dict(on_hand or {})
        self.reserved: dict[str, int] = {}

    def available(self, sku: str) -> int:
        return self.on_hand.get(sku, 0) - self.reserved.get(sku, 0)

    def reserve(self, sku: str, quantity: int) -> None:
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        if quantity > self.available(sku):
            raise OutOfStock(f"{sku}: {self.available(sku)} available, {quantity} asked")
        self.reserved[sku] = self.reserved.get(sku, 0) + quantity

    def release(self, sku: str, quantity: int) -> None:
        held = self.reserved.get(sku, 0)
        self.reserved[sku] = max(0, held - quantity)
