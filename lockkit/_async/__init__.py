"""The asyncio face, written by hand; ``scripts/unasync.py`` generates ``lockkit/_sync`` from it."""
