"""Print N JSON orders, one a line (every 7th a test order): `python make_orders.py 300 | kdg produce orders`."""

import json
import sys


def order(i: int) -> dict:
    items = [{"sku": f"sku-{(i + n) % 13}", "qty": n + 1, "price": f"{(i % 5) + 1}.{n}5"} for n in range(i % 3 + 1)]
    return {"id": i, "customer": f"c{i % 17}", "test": i % 7 == 0, "items": items}


if __name__ == "__main__":
    for i in range(1, int(sys.argv[1]) + 1):
        print(json.dumps(order(i)))
