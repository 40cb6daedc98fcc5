"""Print N JSON payments, one a line, over accounts acct-0 … acct-9: `python make_payments.py 300`."""

import json
import sys


def payment(i: int) -> dict:
    return {"id": i, "account": f"acct-{i % 10}", "amount": (i * 37) % 1000 - 300}  # cents; some refunds


if __name__ == "__main__":
    for i in range(int(sys.argv[1])):
        print(json.dumps(payment(i)))
