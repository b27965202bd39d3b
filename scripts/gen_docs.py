"""The docs' reference tables, generated from the code so that they cannot go stale.

Used two ways:

- as an mkdocs hook (``hooks:`` in mkdocs.yml): a page line ``<!-- generated: NAME -->`` is
  replaced, at build time, by the table NAME;
- as a script, to read a table without building the site:
  ``python scripts/gen_docs.py configuration|cli|errors|api``.

NAME is one of ``configuration`` (every ``REDISBUS_*`` variable, from ``BusSettings`` and
``ExporterSettings``), ``cli`` (every command of the typer app, with its options),
``errors`` (the error tree of ``redisbus._errors``) and ``api`` (mkdocstrings directives for
every public name of ``redisbus``).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script or loaded by mkdocs from a checkout
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- generated: ([a-z]+) -->$", re.MULTILINE)


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# -- configuration ------------------------------------------------------------------------------


def _default(name: str, field: Any) -> str:
    if field.default_factory is not None:
        if name == "host":
            return "this machine's hostname"
        return f"`{field.default_factory()!r}`"
    if field.default is None:
        return "unset"
    return f"`{field.default!r}`"


def _type(field: Any) -> str:
    ann = field.annotation
    text = ann.__name__ if isinstance(ann, type) else str(ann)
    return text.replace("typing.", "").replace("NoneType", "None")


def _bounds(field: Any) -> str:
    out = []
    for meta in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value}")
    return ", ".join(out)


def _settings_table(cls: Any, names: list[str]) -> str:
    rows = [
        "| variable | type | default | bounds | meaning |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        field = cls.model_fields[name]
        rows.append(
            f"| `REDISBUS_{name.upper()}` | `{_cell(_type(field))}` "
            f"| {_cell(_default(name, field))} | {_cell(_bounds(field))} "
            f"| {_cell(field.description or '')} |"
        )
    return "\n".join(rows)


def configuration() -> str:
    from redisbus import BusSettings
    from redisbus.exporter import ExporterSettings

    bus = list(BusSettings.model_fields)
    exporter = [n for n in ExporterSettings.model_fields if n not in BusSettings.model_fields]
    return (
        "### Every process (`BusSettings`)\n\n"
        + _settings_table(BusSettings, bus)
        + "\n\n### The exporter (`ExporterSettings`, adds to the above)\n\n"
        + _settings_table(ExporterSettings, exporter)
        + "\n"
    )


# -- CLI ----------------------------------------------------------------------------------------


def _param_row(p: Any) -> str:
    if getattr(p, "param_type_name", "") == "argument":
        name = f"`{(p.metavar or p.name or '').upper()}`"
        kind = "argument" + ("" if p.required else " (optional)")
    else:
        name = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
        kind = "flag" if getattr(p, "is_flag", False) else "option"
    envvar = p.envvar if isinstance(p.envvar, str) else ", ".join(p.envvar or [])
    default = p.default
    plain = (
        isinstance(default, str | int | float) and not isinstance(default, bool) and default != ""
    )
    shown = f"`{default}`" if plain or default is True else ""
    helptext = getattr(p, "help", None) or ""
    return (
        f"| {name} | {kind} | {f'`{envvar}`' if envvar else ''} | {_cell(shown)} "
        f"| {_cell(helptext)} |"
    )


def _plugin_help(module: str) -> str:
    """The ``--help`` of a command that parses its own options (``main(argv)``)."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        return f"(needs `{e.name}`: install the matching extra)"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        mod.main(["--help"])
    return buf.getvalue().strip()


def _command(out: list[str], path: str, cmd: Any, ctx: Any, plugins: dict[str, Any]) -> None:
    out.append(f"### `{path}`\n")
    out.append(inspect.cleandoc(cmd.help or "") + "\n")
    name = path.split()[-1]
    if path.count(" ") == 1 and name in plugins:
        out.append("```text\n" + _plugin_help(plugins[name][0]) + "\n```\n")
        return
    params = [p for p in cmd.params if p.name != "help"]
    if params:
        out.append("| name | kind | environment | default | meaning |")
        out.append("|---|---|---|---|---|")
        out.extend(_param_row(p) for p in params)
        out.append("")
    for sub in getattr(cmd, "commands", {}):  # a group: its subcommands
        _command(out, f"{path} {sub}", cmd.commands[sub], ctx, plugins)


def cli() -> str:
    import typer

    from redisbus import cli as cli_module

    # commands that parse their own options (``main(argv)``), if the CLI still has any
    plugins: dict[str, Any] = getattr(cli_module, "PLUGINS", {})
    group: Any = typer.main.get_command(cli_module.app)
    out: list[str] = []
    ctx = group.make_context("redisbus", [], resilient_parsing=True)
    for name in group.list_commands(ctx):
        _command(out, f"redisbus {name}", group.get_command(ctx, name), ctx, plugins)
    return "\n".join(out)


# -- errors -------------------------------------------------------------------------------------


def _tree_notes(doc: str) -> dict[str, str]:
    """The one-line meanings drawn beside each class in ``redisbus._errors``'s docstring."""
    notes = {}
    for line in doc.splitlines():
        m = re.match(r"^[\s│├└─]*([A-Z]\w+)(?: \([^)]*\))?\s{2,}(.+)$", line)
        if m:
            notes[m.group(1)] = m.group(2).strip()
    return notes


def errors() -> str:
    from redisbus import _errors

    notes = _tree_notes(_errors.__doc__ or "")
    drawn = re.findall(r"^[\s│├└─]*([A-Z]\w+)", _errors.__doc__ or "", re.MULTILINE)
    order = {name: i for i, name in enumerate(drawn)}  # as the docstring draws the tree
    rows = [
        "| error | subclass of | `code` | when | carries |",
        "|---|---|---|---|---|",
    ]

    def walk(cls: type, depth: int) -> None:
        parents = ", ".join(
            f"`{b.__name__}`" for b in cls.__bases__ if b is not object and b is not Exception
        )
        doc = (cls.__doc__ or "").strip().split("\n\n")[0] if "__doc__" in vars(cls) else ""
        when = notes.get(cls.__name__) or doc
        carries = (
            "`.limit`, `.current`, `.retry_after_s`"
            if issubclass(cls, _errors.LimitExceeded)
            else ""
        )
        indent = "&nbsp;&nbsp;" * depth
        code = getattr(cls, "code", "")
        rows.append(
            f"| {indent}`{cls.__name__}` | {parents} | `{code}` | {_cell(when)} | {carries} |"
        )
        sub: type
        for sub in sorted(cls.__subclasses__(), key=lambda c: order.get(c.__name__, len(order))):
            walk(sub, depth + 1)

    walk(_errors.RedisbusError, 0)
    return "\n".join(rows) + "\n"


# -- API ----------------------------------------------------------------------------------------


def api() -> str:
    import redisbus

    return "\n".join(f"::: redisbus.{name}\n" for name in redisbus.__all__)


TABLES: dict[str, Callable[[], str]] = {
    "configuration": configuration,
    "cli": cli,
    "errors": errors,
    "api": api,
}


def expand(markdown: str) -> str:
    """Replace each ``<!-- generated: NAME -->`` line by the table NAME."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in TABLES:
            raise ValueError(f"unknown generated table {name!r}; known: {sorted(TABLES)}")
        return TABLES[name]()

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:  # the mkdocs hook
    return expand(markdown)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in TABLES:
        sys.exit(f"usage: python scripts/gen_docs.py {'|'.join(TABLES)}")
    sys.stdout.write(TABLES[sys.argv[1]]() + "\n")
