"""A user's transforms for tests: orders with line items (test orders dropped, a total computed, items exploded)."""

from decimal import Decimal


def orders(record):
    order = record.value
    if order.get("test"):
        return None
    return {"id": order["id"], "total": sum(Decimal(i["price"]) * i["qty"] for i in order["items"])}


def lines(record):
    order = record.value
    if order.get("test"):
        return None
    return [{"order_id": order["id"], "n": n, "sku": i["sku"], "qty": i["qty"]} for n, i in enumerate(order["items"])]


def fragile(record):
    """Raises on every 100th order: the record's error, not the pipeline's."""
    if record.value["id"] % 100 == 42:
        raise ValueError(f"order {record.value['id']} has no customer")
    return record.value


def choosy(record):
    """:func:`fragile`, and test orders filtered out."""
    order = fragile(record)
    return None if order.get("test") else order
