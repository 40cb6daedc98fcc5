"""A user's ``--handler``, called inside the batch's transaction, with nothing it asked for left undone.

A handler is ``handler(rows, conn)``, sync or async, where ``conn`` is the batch's open asyncpg
connection. asyncpg's calls are coroutines: a sync handler that calls ``conn.execute(...)`` without
awaiting it makes a coroutine that never runs, and Python only warns. Its effects would be missing
while the batch's rows and offsets commit. So the handler gets the connection through a thin proxy
that notes each coroutine it makes; one that never ran fails the batch, rolled back, with one line
that says how to write the handler.

Example of a handler (``shop/balances.py``, ``--handler shop.balances:apply``)::

    async def apply(rows, conn):
        for row in rows:
            await conn.execute("UPDATE accounts SET balance = balance + $1 WHERE id = $2", ...)
"""

import inspect

from kdg.errors import UsageError


class HandlerNotAwaited(UsageError):
    """A ``--handler`` made asyncpg calls that never ran: the batch was rolled back, nothing committed."""


class _Watched:
    """The connection as the handler sees it: every attribute the connection's, each coroutine noted."""

    def __init__(self, conn):
        self._conn = conn
        self._made: list[tuple[str, object]] = []

    def __getattr__(self, name: str):
        attr = getattr(self._conn, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            out = attr(*args, **kwargs)
            if inspect.iscoroutine(out):
                self._made.append((name, out))
            return out

        return call

    def never_ran(self) -> list[str]:
        """The calls whose coroutine was never awaited (closed now, so Python does not warn of them too)."""
        names = []
        for name, coro in self._made:
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()
                names.append(name)
        return names


async def call_handler(handler, rows: list, conn) -> None:
    """Run ``handler(rows, conn)`` (awaited if it is async); raise :class:`HandlerNotAwaited` if any asyncpg
    call it made never ran."""
    watched = _Watched(conn)
    out = handler(rows, watched)
    if inspect.isawaitable(out):
        await out
    never = watched.never_ran()
    if never:
        name = getattr(handler, "__qualname__", repr(handler))
        raise HandlerNotAwaited(
            f"--handler {getattr(handler, '__module__', '?')}:{name} called conn.{never[0]}(…) without awaiting "
            f"it ({len(never)} call(s)), so it never ran; the batch was rolled back and its offsets did not move. "
            "Write the handler as `async def` and `await` each call on the connection")
