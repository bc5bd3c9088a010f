"""The blocking face: generated from ``lockkit/_async`` by ``scripts/unasync.py`` (see CONTRIBUTING.md)."""
