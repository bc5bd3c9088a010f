"""kazoo plumbing for :mod:`lockkit.drivers.zookeeper`: building the client, and what kazoo does not offer.

* the negotiated session timeout, which kazoo keeps as a local of its handshake
  (python-zk/kazoo#769): read from the server's connect reply by wrapping the
  connection's ``_invoke``, the one call that performs the handshake;
* container nodes (``createContainer``, opcode 19), which kazoo's ``create()``
  cannot make: sent through kazoo's request queue;
* a barrier behind kazoo's watch callbacks (see :func:`barrier`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Connect, Create2
from kazoo.protocol.states import Callback

from ...errors import ConfigError
from .nodes import Transient, ZooKeeperOptions

CONTAINER_FLAG = 4
"""``CreateMode.CONTAINER``: the server deletes the node once its last child is gone (ZooKeeper ≥ 3.5.3)."""


class CreateContainer(Create2):  # type: ignore[misc]  # kazoo is untyped
    """ZooKeeper's ``createContainer`` request: the body and reply of ``create2``, another opcode."""

    type = 19


def new_client(
    hosts: str, options: ZooKeeperOptions, credential: str | None, on_negotiated: Callable[[float], None]
) -> KazooClient:
    kz = KazooClient(
        hosts=hosts,
        timeout=options.session_timeout,
        auth_data=[("digest", credential)] if credential else None,
        randomize_hosts=options.randomize_hosts,
        # reconnect fast (a lock's session is at stake), never give up; lockkit retries commands itself
        connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_jitter": 0.2, "max_delay": 1.0},
        command_retry={"max_tries": 0},
    )
    connection: Any = getattr(kz, "_connection", None)
    original = getattr(connection, "_invoke", None)
    if connection is None or original is None:
        raise ConfigError("this kazoo version hides its handshake; lockkit needs kazoo 2.10 or 2.11")

    def invoke(timeout: float, request: Any, xid: int | None = None) -> Any:
        result = original(timeout, request, xid)
        if isinstance(request, Connect) and result and getattr(result[0], "time_out", 0) > 0:
            on_negotiated(result[0].time_out / 1000.0)
        return result

    connection._invoke = invoke
    return kz


def create_parent_async(kz: KazooClient, parent: str, acl: Any, container: bool) -> Any:
    if not container:
        return kz.create_async(parent, b"", acl)
    result = kz.handler.async_result()
    kz._call(CreateContainer(parent, b"", acl, CONTAINER_FLAG), result)
    return result


def barrier(kz: KazooClient, timeout: float) -> None:
    """Wait until kazoo has run every watch callback for the events it has received so far.

    kazoo reads watch events and replies on one thread, in the server's order,
    but runs watch callbacks on another: after a reply, a marker queued behind
    them proves that no earlier deletion of one of our nodes is still unseen.
    """
    done = threading.Event()
    kz.handler.dispatch_callback(Callback("watch", done.set, ()))
    if not done.wait(timeout):
        raise Transient("kazoo's event thread did not answer")
