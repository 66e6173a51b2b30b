"""Pieces both processes share: the response envelope, error kinds, config loading, task ids, logging."""
