"""A small stock-keeping service: reservations in memory, a warehouse API client."""
