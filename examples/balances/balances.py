"""A kdg handler: each payment moves an account's balance, in the transaction that writes the payment.

``kdg consume payments --handler balances:apply`` calls :func:`apply` with the rows a batch writes and the
open asyncpg connection, inside the batch's transaction. Under exactly-once it is given only the rows this
transaction writes (never a duplicate kdg suppressed), and the balance moves commit with the payments and the
consumer's offsets, or not at all: each payment moves a balance exactly once, through any crash.
"""

import json


async def apply(rows, conn):
    """Add each payment's amount (in cents) to its account's balance."""
    for row in rows:  # the generic table's rows: (idempotency_key, topic, partition, offset, key, value, headers)
        payment = json.loads(row[5])
        await conn.execute("UPDATE accounts SET balance = balance + $1 WHERE id = $2",
                           payment["amount"], payment["account"])
