"""``postgresql://`` and ``postgres://``: session-level advisory locks on one PostgreSQL server (psycopg 3).

:mod:`.driver` gathers both faces; ``_async/driver.py`` is the hand-written source, ``_sync/driver.py`` its
generated blocking twin. :mod:`.config` parses the URL, :mod:`.keys` maps names to advisory keys, :mod:`.sql`
holds the statements and :mod:`.facts` the guarantees.
"""
