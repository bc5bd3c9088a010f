"""The blocking face of the Redis drivers: generated from ``../_async`` by ``scripts/unasync.py``."""
