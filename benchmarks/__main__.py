"""`python -m benchmarks NAME [options]`: one entry point for every benchmark."""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from pathlib import Path

# name -> (group, module), grouped as the subpackages are: speed/, quality/, gpu/. A new benchmark is one module
# in its group's folder plus one line here; the name is what a user types, so it never changes with the folder.
BENCHMARKS = {
    "gpt-train-step": ("speed", "benchmarks.speed.gpt_train_step"),
    "bert-train-step": ("speed", "benchmarks.speed.bert_train_step"),
    "pretrain-step": ("speed", "benchmarks.speed.pretrain_step"),
    "lstm-step": ("speed", "benchmarks.speed.lstm_step"),
    "lm-head": ("speed", "benchmarks.speed.lm_head"),
    "nanogpt-char": ("speed", "benchmarks.speed.nanogpt_char"),
    "varlen-sst2": ("speed", "benchmarks.speed.varlen_sst2"),
    "ppl-speed": ("speed", "benchmarks.speed.ppl_speed"),
    "tokenize-speed": ("speed", "benchmarks.speed.tokenize_speed"),
    "tokenize-memory": ("speed", "benchmarks.speed.tokenize_memory"),
    "mlm-data": ("speed", "benchmarks.speed.mlm_data"),
    "input-pipeline": ("speed", "benchmarks.speed.input_pipeline"),
    "word2vec": ("speed", "benchmarks.speed.word2vec"),
    "startup": ("speed", "benchmarks.speed.startup"),
    "bert-sst2": ("quality", "benchmarks.quality.bert_sst2"),
    "bert-plateau": ("quality", "benchmarks.quality.bert_plateau"),
    "family-sst2": ("quality", "benchmarks.quality.family_sst2"),
    "small-data-finetune": ("quality", "benchmarks.quality.small_data_finetune"),
    "low-resource": ("quality", "benchmarks.quality.low_resource"),
    "conll-ner": ("quality", "benchmarks.quality.conll_ner"),
    "cmrc2018": ("quality", "benchmarks.quality.cmrc"),
    "ngram-ptb": ("quality", "benchmarks.quality.ngram_ptb"),
    "txl-vs-gpt": ("quality", "benchmarks.quality.txl_vs_gpt"),
    "gpu-check": ("gpu", "benchmarks.gpu.gpu_check"),
    "gpu-mfu": ("gpu", "benchmarks.gpu.gpu_mfu"),
    "gpu-varlen": ("gpu", "benchmarks.gpu.gpu_varlen"),
}
GROUPS = ("speed", "quality", "gpu")  # the order of --help's headings

# Arguments that mean the same in every benchmark that takes them, declared here once. A module takes one by
# naming it in its DEFAULTS ({"repeats": 5}, {"keep": None}), with its own default; --threads, --no-write and
# --preliminary every benchmark takes.
OPTIONAL = {
    "repeats": dict(type=int, help="timed rounds; where several sides are compared, each round runs every side once "
                                   "(interleaved), and the table gives the median over the rounds"),
    "keep": dict(type=Path, help="work under this directory and keep what the runs leave there (a benchmark that "
                                 "resumes reads it back); default: a temporary directory, deleted"),
}


class _Help(argparse.HelpFormatter):
    """Shows a default only where it says something: None, False and [] mean 'see the help text'."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        silent = d is None or d is False or d == [] or d == argparse.SUPPRESS
        if not silent and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def add_shared_arguments(p: argparse.ArgumentParser, defaults: dict) -> None:
    """The shared argument set: the options every benchmark takes, then those of OPTIONAL its DEFAULTS names."""
    unknown = set(defaults) - set(OPTIONAL)
    if unknown:
        raise ValueError(f"DEFAULTS names {sorted(unknown)}, not a shared argument ({', '.join(OPTIONAL)})")
    for key, spec in OPTIONAL.items():
        if key in defaults:
            p.add_argument(f"--{key}", default=defaults[key], **spec)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (torch.set_num_threads)")
    p.add_argument("--no-write", action="store_true", help="print the results only; leave BENCHMARKS.md alone")
    p.add_argument("--preliminary", action="store_true",
                   help="mark the section as preliminary (e.g. measured on a busy machine)")


def _listing(modules: dict) -> str:
    """--help's list of benchmarks: one heading per group (its subpackage's docstring), its names beneath."""
    width = max(map(len, BENCHMARKS)) + 2
    blocks = []
    for group in GROUPS:
        doc = (importlib.import_module(f"benchmarks.{group}").__doc__ or group).strip()
        lines = [f"{group}: {doc.split(': ', 1)[-1].rstrip('.')}"]
        for name, (g, _) in BENCHMARKS.items():
            if g == group:
                lines.append(textwrap.fill(modules[name].HELP, 116, initial_indent=f"  {name:<{width}}",
                                           subsequent_indent=" " * (width + 2)))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def build_parser() -> argparse.ArgumentParser:
    # Modules import torch lazily inside run(), so building the parser (and --help) stays fast.
    modules = {name: importlib.import_module(module_name) for name, (_, module_name) in BENCHMARKS.items()}
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Compare plm with its peers side by side; each run rewrites its own section of BENCHMARKS.md.",
        epilog=_listing(modules) + "\n\nexample: python -m benchmarks gpt-train-step --repeats 5\n"
               "each NAME's own options: python -m benchmarks NAME --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="name", metavar="NAME", required=True,
                                help="one of the benchmarks listed below")
    for name, (group, _) in BENCHMARKS.items():
        module = modules[name]
        p = sub.add_parser(name, description=f"[{group}] {module.HELP}", formatter_class=_Help)
        module.add_arguments(p)
        add_shared_arguments(p, getattr(module, "DEFAULTS", {}))
        p.set_defaults(module=module, group=group)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # recorded verbatim in BENCHMARKS.md so a reader can re-run the same command
    return args.module.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
