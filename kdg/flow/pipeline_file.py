"""The pipeline file (``--pipeline FILE``): ``[[route]]`` entries in TOML, read into :class:`~kdg.flow.routes.Route`.

::

    [[route]]
    name = "replica"                      # optional; "route 1", "route 2", … by position
    topic_pattern = 'shop\\.public\\..*'  # or topics = ["a", "b"] (or both)
    table = "replica.{source.table}"      # a table, or a template: {topic}, {1}, {source.table}, …
    envelope = "debezium"                 # a typed route: a mapping's keys inline, or mapping = "FILE.toml"
    [route.columns]
    id = { type = "bigint", from = "json:id" }

A route with neither columns nor a mapping file is the generic sink table. ``id_from`` names the idempotency
key of records without a ``kdg-id`` header, as ``--id-from`` does.
A key the file does not know is refused, naming it and the keys there are.
"""

import difflib
import tomllib
from pathlib import Path

from kdg.errors import UsageError
from kdg.flow.routes import Route, Router

_MAPPING_KEYS = ("mode", "key", "on_tombstone", "on_truncate", "create_table", "envelope", "value_format",
                 "key_format", "columns", "extra_columns", "evolve", "on_incompatible")
ROUTE_KEYS = ("name", "topics", "topic_pattern", "table", "mapping", "id_from", "transform", "into", *_MAPPING_KEYS)
PLACEHOLDER_TABLE = "kdg_route_table"  # a typed route's mapping is built with this; the template fills it


def load_pipeline(path: Path) -> Router:
    """The routes of the pipeline file at ``path``; anything wrong is a usage error naming the file and route."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--pipeline {path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--pipeline {path}: not TOML ({exc})") from None
    unknown = sorted(set(doc) - {"route"})
    if unknown:
        raise UsageError(f"--pipeline {path}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0], ('route',))}; "
                         "a pipeline file holds [[route]] entries")
    entries = doc.get("route")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"--pipeline {path}: give one or more [[route]] entries")
    routes = [r for i, entry in enumerate(entries, 1) for r in _routes(path, i, entry)]
    try:
        return Router(routes)
    except UsageError as exc:  # two routes listing one topic, or named alike
        raise UsageError(f"--pipeline {path}: {exc}") from None


def _routes(path: Path, index: int, entry: dict) -> list[Route]:
    """A ``[[route]]``: one route, or with ``[[route.into]]`` entries a fan-out — one route per table, each
    with its own table, mapping and transform, taking the entry's topics (one transaction writes them all)."""
    into = entry.get("into")
    if into is None:
        return [_route(path, index, entry)]
    name = entry.get("name", f"route {index}")
    where = f"--pipeline {path}: {name}"
    if not isinstance(into, list) or not into or not all(isinstance(e, dict) for e in into):
        raise UsageError(f"{where}: into must be [[route.into]] entries, each with its table")
    shared = ("name", "topics", "topic_pattern", "id_from")
    own = sorted(set(entry) - set(shared) - {"into"})
    if own:
        raise UsageError(f"{where}: {own[0]} goes in each [[route.into]] entry (the route gives only "
                         f"{', '.join(shared)} and into)")
    made = []
    for i, out in enumerate(into, 1):
        inner = sorted(set(out) & set(shared))
        if inner:
            raise UsageError(f"{where}: into {i}: {inner[0]} is the route's, not an into entry's")
        made.append(_route(path, index, {**{k: v for k, v in entry.items() if k != "into"}, **out,
                                         "name": f"{name} → {out.get('table', i)}"}, fan=str(name)))
    return made


def _route(path: Path, index: int, entry: dict, fan: str | None = None) -> Route:
    name = entry.get("name", f"route {index}")
    where = f"--pipeline {path}: {name if 'name' in entry else f'route {index}'}"
    unknown = sorted(set(entry) - set(ROUTE_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0], ROUTE_KEYS)}; "
                         f"a route's keys are {', '.join(ROUTE_KEYS)}")
    for key, kind in (("name", str), ("topic_pattern", str), ("table", str), ("mapping", str), ("id_from", str),
                      ("transform", str)):
        if key in entry and not isinstance(entry[key], kind):
            raise UsageError(f"{where}: {key} must be a string, not {entry[key]!r}")
    topics = entry.get("topics", [])
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, list) or not all(isinstance(t, str) and t for t in topics):
        raise UsageError(f"{where}: topics must list topic names, not {topics!r}")
    mapping = _mapping(path, where, entry)
    table = entry.get("table") or (mapping_table if (mapping_table := _file_table(path, entry)) else None)
    if mapping is not None and not table:
        raise UsageError(f"{where}: a typed route needs its table: table = \"[SCHEMA.]NAME\" or a template")
    try:
        return Route(str(name), tuple(topics), entry.get("topic_pattern"), table or "kdg_events", mapping,
                     entry.get("id_from"), entry.get("transform"), fan, options={k: v for k, v in entry.items() if k != "columns"})
    except UsageError as exc:
        raise UsageError(f"--pipeline {path}: {exc}") from None


def _file_table(path: Path, entry: dict) -> str | None:
    if "mapping" not in entry:
        return None
    from kdg.mapping.spec import load_file

    return load_file(path.parent / entry["mapping"]).get("table")


def _mapping(path: Path, where: str, entry: dict):
    """The route's mapping (inline keys over its mapping file's), or None for a generic route."""
    inline = {k: entry[k] for k in _MAPPING_KEYS if k in entry}
    if not inline and "mapping" not in entry:
        return None
    from kdg.mapping.spec import build_mapping

    columns = inline.get("columns", {})
    from_schema = columns == "from-schema"
    if "extra_columns" in inline and not from_schema:
        raise UsageError(f'{where}: extra_columns go with columns = "from-schema" (list them in [route.columns])')
    if from_schema:
        columns = inline.get("extra_columns", {})  # source:ts_ms and the like, besides the schema's
    if not isinstance(columns, dict):
        raise UsageError(f"{where}: columns must be \"from-schema\" or a table [route.columns] of "
                         "NAME = {{ type = …, from = … }}")
    specs = []
    for col, spec in columns.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("from"), str) or not set(spec) <= {"type", "from"}:
            raise UsageError(f'{where}: column {col!r} must be {{ type = "TYPE", from = "SOURCE" }}')
        specs.append(f"{col} {spec.get('type', '')} = {spec['from']}")
    key = inline.get("key", ())
    key = (key,) if isinstance(key, str) else tuple(key)
    try:
        return build_mapping(file=path.parent / entry["mapping"] if "mapping" in entry else None, columns=specs,
                             table=PLACEHOLDER_TABLE, mode=inline.get("mode"), on_tombstone=inline.get("on_tombstone"),
                             on_truncate=inline.get("on_truncate"),
                             create_table=bool(inline.get("create_table", False)), key=key,
                             envelope=inline.get("envelope"), value_format=inline.get("value_format"),
                             key_format=inline.get("key_format"), from_schema=from_schema,
                             evolve=inline.get("evolve"), on_incompatible=inline.get("on_incompatible"))
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
