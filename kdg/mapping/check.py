"""`kdg mapping check`: a mapping file read and checked against its live table, writing nothing."""

from dataclasses import asdict, dataclass, field
from pathlib import Path

from kdg.mapping.spec import build_mapping, spelled
from kdg.settings import redact_dsn


@dataclass
class MappingCheckReport:
    file: str
    table: str
    mode: str
    key: list[str]
    on_tombstone: str
    create_table: bool
    table_state: str                 # exists | would be created | not checked (--offline)
    envelope: str = "none"           # none | debezium
    dsn: str | None = None           # without its password
    columns: list[dict] = field(default_factory=list)  # name (as SQL spells it), type, from, table_type

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": True}


def run_mapping_check(path: Path, dsn: str | None) -> MappingCheckReport:
    """Parse ``path``; with ``dsn``, check it against the table there (a dry run: nothing is created).

    Any problem is a usage error naming it; a report means the mapping is good.
    """
    mapping = build_mapping(file=path)
    shape, state = None, "not checked (--offline)"
    if dsn is not None:
        from kdg.store.pg import Store

        with Store(dsn) as store:
            target, shape = store.prepare_typed(mapping, dry_run=True)
        mapping = target.mapping
        state = "exists" if shape is not None else "would be created"
    return MappingCheckReport(
        file=str(path), table=mapping.table.text, mode=mapping.mode, key=list(map(spelled, mapping.key)),
        on_tombstone=mapping.on_tombstone, create_table=mapping.create_table, table_state=state,
        envelope=mapping.envelope,
        dsn=redact_dsn(dsn) if dsn else None,
        columns=[{"name": spelled(c.name), "type": c.type_name, "from": c.source.spec,
                  "table_type": shape.types.get(c.name) if shape is not None else None} for c in mapping.columns])
