"""The benchmarks' own transforms (``--transform bench_logic:identity``)."""


def identity(record):
    """The cheapest transform there is: the record's decoded value, as it is (its row for the mapping)."""
    return record.value
