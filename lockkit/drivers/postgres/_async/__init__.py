"""The asyncio face of the PostgreSQL driver, written by hand (``../_sync`` is generated from it)."""
