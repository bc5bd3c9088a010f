"""The conformance suite's blocking face: generated from ``../_async`` by ``scripts/unasync.py``."""
