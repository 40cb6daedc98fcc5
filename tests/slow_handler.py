"""A user handler for tests that makes a consumer slow: it sleeps inside each batch's transaction."""

import asyncio


async def slow(rows, conn):
    await asyncio.sleep(0.4)
