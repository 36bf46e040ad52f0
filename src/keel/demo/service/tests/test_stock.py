"""Reservations never exceed what is on hand."""

from __future__ import annotations

import unittest

from inventory.stock import OutOfStock, Stock


class StockTest(unittest.TestCase):
    def test_reserve_reduces_available(self) -> None:
        stock = Stock({"bolt": 10})
        stock.reserve("bolt", 3)
        self.assertEqual(stock.available("bolt"), 7)

    def test_reserving_more_than_available_is_refused(self) -> None:
        stock = Stock({"bolt": 2})
        with self.assertRaises(OutOfStock):
            stock.reserve("bolt", 3)

    def test_release_frees_reserved_items(self) -> None:
        stock = Stock({"bolt": 5})
        stock.reserve("bolt", 5)
        stock.release("bolt", 2)
        self.assertEqual(stock.available("bolt"), 2)


if __name__ == "__main__":
    unittest.main()
