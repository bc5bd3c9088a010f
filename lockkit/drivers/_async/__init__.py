"""Driver wrappers written once, as asyncio code; ``scripts/unasync.py`` generates ``lockkit/drivers/_sync``."""
