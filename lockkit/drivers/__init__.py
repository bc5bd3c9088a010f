"""Built-in drivers, one package per backend. Import nothing here: drivers load lazily by scheme.

``redis/`` (``redis://`` and ``redlock://``), ``etcd/``, ``zookeeper/``, ``embedded/`` (``memory://``,
``file://``); ``migrate`` and ``epoch`` wrap any of them. ``redlock``, ``file`` and ``memory`` here are
compatibility modules that keep the import paths of the flat layout working.
"""
