"""`plm recipes`: list the shipped recipes, show one resolved, find the accelerate configs."""

from __future__ import annotations

from typing import List, Optional

import typer

from plmcli.cli._common import ReportingGroup, print_json
from plmcli.errors import PlmError

app = typer.Typer(help="List the shipped recipes or show one fully resolved.", invoke_without_command=True,
                 cls=ReportingGroup)


# ---------------------------------------------------------------- recipes


@app.callback()
def recipes(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")):
    """List every shipped recipe: name, family, objective, parameters, and the first sentence of its
    description, one line each; `plm recipes show NAME` prints a recipe whole, --json lists them all.

    Example: plm recipes
    """
    if ctx.invoked_subcommand is not None:
        return
    from plmcli import api

    rows = api.list_recipes()
    if as_json:
        return print_json(rows)
    import re

    from rich import box
    from rich.console import Console
    from rich.table import Table

    cells = [(r["name"], r["family"] or "", r["objective"] or "", f"{r['params'] / 1e6:,.1f}M",
              # the first sentence of the first line ("et al. 2019" does not end one): `recipes show` has the rest
              re.split(r"(?<=[.!?])\s+(?=[A-Z])", r["description"].strip().split("\n", 1)[0], maxsplit=1)[0])
             for r in rows]
    console = Console()
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    heads = ("recipe", "family", "objective", "params")
    widths = [max(len(head), *(len(c[i]) for c in cells)) for i, head in enumerate(heads)]
    for head, width in zip(heads, widths):  # never cut: a name is what the user types next
        table.add_column(head, no_wrap=True, min_width=width, justify="right" if head == "params" else "left")
    # the description gets the width that is left: each column is padded by 2, and 1 separates two columns
    left = max(console.width - sum(widths) - 3 * len(heads) - 2, 8)
    table.add_column("description", no_wrap=True, overflow="ellipsis", max_width=left)
    for c in cells:
        table.add_row(*c)
    console.print(table)


@app.command("list")
def recipes_list(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")):
    """Same as `plm recipes`."""
    recipes(typer.Context(typer.main.get_command(app)), as_json)


@app.command("show")
def recipes_show(
    name: str = typer.Argument(..., help="A shipped recipe name or a path to a .yaml recipe."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", help="Override a key: section.key=value (repeatable)."),
):
    """Print the fully resolved recipe as YAML.

    Example: plm recipes show gpt2-small --set train.max_steps=100
    """
    from plmcli import api

    typer.echo(api.show_recipe(name, overrides), nl=False)


@app.command("accelerate")
def recipes_accelerate(name: Optional[str] = typer.Argument(None, help="ddp | fsdp | deepspeed-zero2 | deepspeed-zero3")):
    """Where the shipped `accelerate launch` configs are (all of them, or NAME's path alone).

    Example: accelerate launch --config_file $(plm recipes accelerate ddp) --num_processes 8 -m plmcli pretrain --recipe bert-base
    """
    from plmcli import api

    configs = api.accelerate_configs()
    if name is not None and name not in configs:
        raise PlmError(f"no shipped accelerate config '{name}'", f"one of: {', '.join(configs)}")
    typer.echo(configs[name] if name else "\n".join(f"{key:16} {path}" for key, path in configs.items()))
