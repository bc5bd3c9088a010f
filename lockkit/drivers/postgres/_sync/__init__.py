"""The blocking face of the PostgreSQL driver: ``driver.py`` is generated from ``../_async``; ``primitives.py``
is written by hand."""
