"""User handlers for tests: one counts each batch's rows in a table inside the sink's transaction, one raises."""


async def count_rows(rows, conn):
    await conn.execute("CREATE TABLE IF NOT EXISTS handler_counts (topic text, n int)")
    if rows:
        await conn.execute("INSERT INTO handler_counts VALUES ($1, $2)", rows[0][1], len(rows))


class HandlerBug(RuntimeError):
    """What a user's handler with a bug raises; kdg has no name for it (tests/test_bad_input.py)."""


async def explode(rows, conn):
    raise HandlerBug(f"boom after {len(rows)} rows")
