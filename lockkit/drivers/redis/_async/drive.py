"""The runner of the I/O-free acquire flows (:mod:`..flow`) on this face: it performs what a flow yields."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..flow import Flow, Op

__all__ = ["adrive"]

R = TypeVar("R")


async def adrive(flow: Flow[R], perform: Callable[[Op], Awaitable[Any]]) -> R:
    """Run ``flow`` to its end, each operation it yields performed by ``perform``; the flow is closed after."""
    try:
        result: Any = None
        while True:
            try:
                op = flow.send(result)
            except StopIteration as stop:
                value: R = stop.value
                return value
            result = await perform(op)
    finally:
        flow.close()
