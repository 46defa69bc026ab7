"""The `plm` command line: each command parses its options and calls plmcli.api — nothing else.

This module builds the one Typer app and adds the command modules' commands to it: recipes.py,
data.py (tokenize, make-mlm-data), train.py (pretrain, finetune), evaluate.py (eval-ppl, generate, zero-shot, lm-eval, eval-vectors) and
insight.py (plot, export, import, attention, probe); _common.py holds what they share. Heavy libraries
(torch, datasets) are imported inside api calls so `plm --help` starts fast.
"""

from __future__ import annotations

import typer

from plmcli.cli import data, evaluate, insight, recipes, train
from plmcli.cli._common import Program, ReportingGroup, state

app = Program(
    name="plm",
    help="Pretrain, finetune and evaluate classic language models from one recipe per model.\n\n"
    "Start with: plm pretrain --recipe gpt-mini   then   plm eval-ppl some.txt\n\n"
    "Exit codes: 0 done; 2 bad input or a file plm cannot read or write (one line: error: what — how to fix); "
    "130 interrupted by Ctrl-C, 75 stopped by SIGTERM / SIGUSR1 after a checkpoint (the line says what was left "
    "and how to continue; pretrain --auto-resume continues a requeued job); 1 an internal error, a bug in plm "
    "(plm --debug COMMAND … shows its traceback).",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=ReportingGroup,
)
app.add_typer(recipes.app, name="recipes")
for module in (data, train, evaluate, insight):  # the order `plm --help` lists them in
    module.commands.register(app)


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors.")):
    state["debug"] = debug

