"""Rendering of reports: rich tables for people, JSON for scripts. Styles are named once here."""

import dataclasses
import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.theme import Theme

THEME = Theme({"ok": "green", "bad": "bold red", "warn": "yellow", "dim": "dim", "key": "cyan"})
console = Console(theme=THEME, highlight=False)
err_console = Console(theme=THEME, stderr=True, highlight=False)


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if hasattr(obj, "to_dict"):
            return obj.to_dict()
        return dataclasses.asdict(obj)
    return obj


def print_json(obj: Any, *, compact: bool = False) -> None:
    """``obj`` as JSON on stdout: indented, or one line (``compact``, for a stream of objects)."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=None if compact else 2, default=str) + "\n")
    sys.stdout.flush()


def flag(ok: bool, yes: str = "up", no: str = "DOWN") -> str:
    return f"[ok]{yes}[/ok]" if ok else f"[bad]{no}[/bad]"


def key_value_table(title: str, rows: dict[str, Any]) -> Table:
    """A report as a table; its title and values are shown as they are (a ``[`` in a key or a group name is
    text, never rich markup)."""
    table = Table(title=Text(title), show_header=False, title_justify="left")
    table.add_column(style="key")
    table.add_column()
    for k, v in rows.items():
        table.add_row(Text(k), Text(str(v)))
    return table


def plain(text: str) -> str:
    """``text`` (a name, a key, a DSN such as ``[::1]``'s) made safe to put inside a string with rich markup."""
    return escape(text)
