"""Blocking driver wrappers, generated from ``lockkit/drivers/_async`` by ``scripts/unasync.py``."""
