"""MkDocs hooks (mkdocs.yml: ``hooks:``): pages that are generated from the code at build time, never written twice.

A page asks for generated text with a marker comment on a line of its own:

- ``<!-- kdg:cli-reference -->`` — every command, argument and option of ``kdg.cli:app``, from the Typer app's
  click command tree (the same text ``kdg COMMAND --help`` prints);
- ``<!-- kdg:policy-table -->`` — every setting each guarantee decides, from ``kdg.guarantees``.

``tests/test_docs.py`` imports :func:`command_tree` from here to fail on a command or option without help text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import click

CLI_MARKER = "<!-- kdg:cli-reference -->"
POLICY_MARKER = "<!-- kdg:policy-table -->"


def command_tree() -> Iterator[tuple[list[str], click.Command]]:
    """Every command of the ``kdg`` CLI, depth first, as (its words, e.g. ``["kdg", "stack", "up"]``, command)."""
    import typer.main

    from kdg.cli import _register, app

    _register()  # the top-level commands register themselves on import, as `kdg` does at start

    def walk(cmd: click.Command, path: list[str]):
        yield path, cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            if not sub.hidden:
                yield from walk(sub, path + [name])

    yield from walk(typer.main.get_command(app), ["kdg"])


def _cell(text: object) -> str:
    """Text fit for one cell of a Markdown table: one line, pipes escaped."""
    return re.sub(r"\s+", " ", str(text)).strip().replace("|", "\\|")


def _usage(path: list[str], cmd: click.Command) -> str:
    ctx = click.Context(cmd, info_name=" ".join(path))
    usage = cmd.get_usage(ctx).removeprefix("Usage:").strip()
    return re.sub(r"\{(\w+)\}|(?<=\[)(\w+)(?=\])", lambda m: (m[1] or m[2]).upper(), usage)


def _param_row(param: click.Parameter) -> str:
    if isinstance(param, click.Argument):
        name = f"`{param.name.upper()}`"
        kind = "argument" + ("" if param.required else ", optional")
    else:
        opts = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        name, kind = opts, ("flag" if getattr(param, "is_flag", False) else param.type.name)
        if param.multiple:
            kind += ", repeatable"
    default = param.default
    shown = "" if default in (None, False, (), []) or callable(default) else f"`{default}`"
    env = getattr(param, "envvar", None)
    env = ", ".join(f"`{e}`" for e in ([env] if isinstance(env, str) else env or []))
    return f"| {name} | {_cell(kind)} | {shown} | {env} | {_cell(getattr(param, 'help', '') or '')} |"


def cli_markdown() -> str:
    """The CLI reference: one section per command, with its usage and a table of its parameters."""
    out = []
    for path, cmd in command_tree():
        depth = min(len(path) + 1, 4)  # kdg: ##, kdg stack: ###, kdg stack up: ####
        out.append(f"{'#' * depth} `{' '.join(path)}`\n")
        if cmd.help:
            out.append(cmd.help.strip() + "\n")
        if isinstance(cmd, click.Group):
            subs = sorted(n for n, c in cmd.commands.items() if not c.hidden)
            out.append("Commands: " + ", ".join(f"`{' '.join(path)} {n}`" for n in subs) + ".\n")
        out.append(f"```text\n{_usage(path, cmd)}\n```\n")
        params = [p for p in cmd.params if not getattr(p, "hidden", False)]
        if params:
            out.append("| parameter | kind | default | environment | what |\n|---|---|---|---|---|")
            out.extend(_param_row(p) for p in params)
            out.append("")
    return "\n".join(out)


def policy_markdown() -> str:
    """Every field of each guarantee's policy, side by side (``kdg policy`` prints each one's reason)."""
    from dataclasses import fields

    from kdg.guarantees import all_policies

    policies = all_policies()
    names = [f.name for f in fields(policies[0]) if f.name not in ("guarantee", "reasons")]
    rows = ["| setting | " + " | ".join(p.guarantee.value for p in policies) + " |",
            "|---|" + "---|" * len(policies)]
    for name in names:
        values = [getattr(p, name) for p in policies]
        rows.append(f"| `{name}` | " + " | ".join(f"`{_cell(getattr(v, 'value', v))}`" for v in values) + " |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 — MkDocs' hook signature
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())
    if POLICY_MARKER in markdown:
        markdown = markdown.replace(POLICY_MARKER, policy_markdown())
    return markdown
