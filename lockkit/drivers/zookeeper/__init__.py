"""``zookeeper://``: consensus locks on ZooKeeper (the driver is :mod:`.zookeeper_driver`)."""

from .zookeeper_driver import ZooKeeperDriver, ZooKeeperOptions

__all__ = ["ZooKeeperDriver", "ZooKeeperOptions"]
