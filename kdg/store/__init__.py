"""The one Postgres store: migrations, dedup claims, offsets, ledger and sink writes."""
