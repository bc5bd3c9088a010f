"""The conformance suite's asyncio face, written by hand; ``scripts/unasync.py`` generates ``../_sync`` from it."""
