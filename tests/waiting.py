"""Waiting in tests for something another task or process does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(check: Callable[[], T], timeout: float = 10) -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := check()):
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout:g} s")
        await asyncio.sleep(0.02)
    return value
