"""A user handler for tests: counts each batch's rows in a table, inside the sink's transaction."""


async def count_rows(rows, conn):
    await conn.execute("CREATE TABLE IF NOT EXISTS handler_counts (topic text, n int)")
    if rows:
        await conn.execute("INSERT INTO handler_counts VALUES ($1, $2)", rows[0][1], len(rows))
