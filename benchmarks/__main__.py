"""`python -m benchmarks NAME [options]`: one entry point for every benchmark."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module; a new benchmark is one module plus one line here.
BENCHMARKS = {
    "gpt-train-step": "benchmarks.speed.gpt_train_step",
    "nanogpt-char": "benchmarks.speed.nanogpt_char",
    "bert-sst2": "benchmarks.quality.bert_sst2",
    "bert-train-step": "benchmarks.speed.bert_train_step",
    "mlm-data": "benchmarks.speed.mlm_data",
    "ngram-ptb": "benchmarks.quality.ngram_ptb",
    "txl-vs-gpt": "benchmarks.quality.txl_vs_gpt",
    "family-sst2": "benchmarks.quality.family_sst2",
    "gpu-check": "benchmarks.gpu.gpu_check",
    "gpu-mfu": "benchmarks.gpu.gpu_mfu",
    "conll-ner": "benchmarks.quality.conll_ner",
    "cmrc2018": "benchmarks.quality.cmrc",
    "tokenize-memory": "benchmarks.speed.tokenize_memory",
    "varlen-sst2": "benchmarks.speed.varlen_sst2",
    "tokenize-speed": "benchmarks.speed.tokenize_speed",
    "ppl-speed": "benchmarks.speed.ppl_speed",
    "startup": "benchmarks.speed.startup",
    "bert-plateau": "benchmarks.quality.bert_plateau",
    "gpu-varlen": "benchmarks.gpu.gpu_varlen",
    "word2vec": "benchmarks.speed.word2vec",
    "small-data-finetune": "benchmarks.quality.small_data_finetune",
    "low-resource": "benchmarks.quality.low_resource",
    "pretrain-step": "benchmarks.speed.pretrain_step",
    "lstm-step": "benchmarks.speed.lstm_step",
    "lm-head": "benchmarks.speed.lm_head",
    "input-pipeline": "benchmarks.speed.input_pipeline",
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Compare plm with its peers side by side; each run rewrites its own section of BENCHMARKS.md.",
        epilog="example: python -m benchmarks gpt-train-step --repeats 5",
    )
    sub = parser.add_subparsers(dest="name", metavar="NAME", required=True)
    for name, module_name in BENCHMARKS.items():
        # Modules import torch lazily inside run(), so building the parser (and --help) stays fast.
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP,  # argparse %-formats help
                           formatter_class=_Help)
        module.add_arguments(p)
        p.add_argument("--threads", type=int, default=2, help="torch CPU threads (torch.set_num_threads)")
        p.add_argument("--no-write", action="store_true", help="print the results only; leave BENCHMARKS.md alone")
        p.add_argument("--preliminary", action="store_true",
                       help="mark the section as preliminary (e.g. measured on a busy machine)")
        p.set_defaults(module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # recorded verbatim in BENCHMARKS.md so a reader can re-run the same command
    return args.module.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
