"""One Redis server as the drivers use it: :class:`SyncNode` and :class:`AsyncNode`.

:class:`AsyncNode` is written once (``_async/node.py``) and :class:`SyncNode` generated from it
(``_sync/node.py``); what they send is built in :mod:`.calls`. This module is where all of it is imported from.
"""

from __future__ import annotations

from ._async.node import AsyncNode
from ._sync.node import SyncNode
from .calls import Call, pack_calls

__all__ = ["AsyncNode", "Call", "SyncNode", "pack_calls"]
