"""The orders job's logic: test orders dropped, a total computed from the line items, the items exploded.

Each function is a kdg transform: called with one record (``record.value`` the decoded JSON order, its
decimals as :class:`~decimal.Decimal`), it returns a row (a dict), rows (a list of dicts) or None (filtered).
"""

from decimal import Decimal


def orders(record):
    """One row per order: its id, customer and total; a test order is filtered out."""
    order = record.value
    if order.get("test"):
        return None
    total = sum(Decimal(str(item["price"])) * item["qty"] for item in order["items"])
    return {"id": order["id"], "customer": order["customer"], "total": total}


def lines(record):
    """One row per line item of an order (an explode); a test order has none."""
    order = record.value
    if order.get("test"):
        return None
    return [{"order_id": order["id"], "line": n, "sku": item["sku"], "qty": item["qty"], "price": item["price"]}
            for n, item in enumerate(order["items"])]
