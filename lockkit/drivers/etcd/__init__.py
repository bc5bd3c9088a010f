"""``etcd://`` and ``etcds://``: consensus locks on etcd v3 (the driver is :mod:`.etcd_driver`)."""

from .etcd_driver import EtcdDriver, EtcdOptions

__all__ = ["EtcdDriver", "EtcdOptions"]
