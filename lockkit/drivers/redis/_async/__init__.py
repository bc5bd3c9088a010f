"""The asyncio face of the Redis drivers, written by hand; ``scripts/unasync.py`` generates ``../_sync`` from it."""
