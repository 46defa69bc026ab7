"""Every flag and config key of `plm finetune` and `plm pretrain` that worked before the flags were generated
from the config fields still works, and sets what it set.

Each row is typed out (not read from the code under test): a flag a user has in a script, the config key it sets
and the value that key then holds. The command runs through Typer's CliRunner up to the pipeline, which is
replaced by a recorder of the config it was handed, so nothing trains.
"""

import pytest

from helpers import run
from plmcli.config import load_finetune_config

ALIASES = {"train.batch_size": "train.global_batch_size"}
"""Old key -> the field that holds it now (finetuning's train section is pretraining's)."""


def value(cfg, key: str):
    section, name = ALIASES.get(key, key).split(".")
    part = getattr(cfg, section)
    return getattr(part, name) if hasattr(part, name) else getattr(part, key.split(".")[1])


FINETUNE_FLAGS = [
    # (arguments, key, value it holds)
    (["--task", "rte"], "task.name", "rte"),
    (["-t", "rte"], "task.name", "rte"),
    (["--from", "tests"], "model.from_run", "tests"),  # a local path: a name that is none would be a Hub id
    (["--data-dir", "glue/"], "task.data_dir", "glue/"),
    (["--epochs", "4"], "train.epochs", 4),
    (["--lr", "5e-5"], "optim.lr", 5e-5),
    (["--batch-size", "16"], "train.batch_size", 16),
    (["--seed", "7"], "train.seed", 7),
    (["--max-seq-len", "64"], "task.max_seq_len", 64),
    (["--max-steps", "9"], "train.max_steps", 9),
    (["--init", "random"], "model.init", "random"),
    (["--warmup-ratio", "0.2"], "optim.warmup_ratio", 0.2),
    (["--weight-decay", "0.1"], "optim.weight_decay", 0.1),
    (["--dropout", "0.2"], "model.dropout", 0.2),
    (["--classifier-dropout", "0.3"], "model.classifier_dropout", 0.3),
    (["--freeze"], "model.freeze", True),
    (["--features", "scalar_mix"], "model.features", "scalar_mix"),
    (["--elmo-at-output"], "model.elmo_at_output", True),
    (["--train", "a.tsv"], "task.train", "a.tsv"),
    (["--dev", "b.tsv"], "task.dev", "b.tsv"),
    (["--test", "c.tsv"], "task.test", "c.tsv"),
    (["--text-col", "s"], "task.text_col", "s"),
    (["--text-pair-col", "s2"], "task.text_pair_col", "s2"),
    (["--label-col", "y"], "task.label_col", "y"),
    (["--doc-stride", "64"], "task.doc_stride", 64),
    (["--max-query-len", "32"], "task.max_query_len", 32),
    (["--max-answer-len", "20"], "task.max_answer_len", 20),
    (["--n-best", "10"], "task.n_best", 10),
    (["--crf"], "task.crf", True),
    (["--aux-lm-weight", "0.25"], "task.aux_lm_weight", 0.25),
    (["--set", "train.micro_batch_size=8"], "train.micro_batch_size", 8),
]

FINETUNE_GRID_FLAGS = [
    (["--lr", "5e-5,3e-5"], "grid.lr", [5e-5, 3e-5]),
    (["--epochs", "2,3"], "grid.epochs", [2, 3]),
    (["--batch-size", "16,32"], "grid.batch_size", [16, 32]),
    (["--seeds", "3"], "grid.seeds", 3),
]

FINETUNE_KEYS = [
    # every key of a finetune config (--set, or a --config YAML file) before the train/optim sections were shared
    ("task.name", "rte"), ("task.data_dir", "d/"), ("task.max_seq_len", 64), ("task.train", "a"), ("task.dev", "b"),
    ("task.test", "c"), ("task.text_col", "s"), ("task.text_pair_col", "p"), ("task.label_col", "y"),
    ("task.doc_stride", 64), ("task.max_query_len", 32), ("task.max_answer_len", 20), ("task.n_best", 10),
    ("task.crf", True), ("task.aux_lm_weight", 0.25),
    ("model.from_run", "tests"), ("model.init", "random"), ("model.dropout", 0.2), ("model.classifier_dropout", 0.3),
    ("model.freeze", True), ("model.features", "concat_last_four"), ("model.elmo_at_output", True),
    ("train.epochs", 4), ("train.batch_size", 16), ("train.micro_batch_size", 8), ("train.max_steps", 9),
    ("train.eval_every", 5), ("train.log_every", 3), ("train.seed", 7), ("train.grad_clip", 0.5),
    ("train.mixed_precision", "no"), ("train.activation_checkpointing", True),
    ("optim.name", "adam"), ("optim.lr", 1e-4), ("optim.weight_decay", 0.0), ("optim.warmup_ratio", 0.2),
    ("optim.schedule", "cosine"),
    ("grid.lr", [1e-4, 2e-4]), ("grid.epochs", [2, 3]), ("grid.batch_size", [8, 16]), ("grid.seeds", 2),
]


@pytest.fixture
def handed(monkeypatch):
    """The FinetuneConfig (or the pretraining stages) the pipeline was handed, instead of training."""
    got = {}

    def one(cfg, out=None, eval_only=False, console=None):
        got.update(cfg=cfg, out=out, eval_only=eval_only)
        return {"out_dir": "x", "task": "t", "dev": {}, "test_predictions": {}}

    def grid(cfg, out=None, console=None):
        got.update(cfg=cfg, out=out)
        return {"out_dir": "x", "task": "t", "runs": [], "main_metric": "m",
                "best": {"lr": 1.0, "epochs": 1, "batch_size": 1, "seed": 1, "metric": 0.0, "dir": "d"}}

    def stages(r, names, stages, data, run_dir, resume, restart, streaming, time_budget, stop_after, console, held):
        got.update(recipe=r, stages=stages, data=data, run_dir=run_dir, streaming=streaming, time_budget=time_budget,
                   stop_after=stop_after)
        return {"run_dir": str(run_dir), "steps": 0, "tokens": 0, "elapsed_s": 0.0}

    import plmcli.pipelines.finetune as ft
    import plmcli.pipelines.finetune_grid as fg
    import plmcli.pipelines.pretrain as pt

    monkeypatch.setattr(ft, "run_finetune", one)
    monkeypatch.setattr(fg, "run_grid", grid)
    monkeypatch.setattr(pt, "pretrain_run", stages)
    return got


@pytest.mark.parametrize("args,key,expected", FINETUNE_FLAGS + FINETUNE_GRID_FLAGS, ids=lambda x: str(x))
def test_every_finetune_flag_sets_its_key(handed, args, key, expected):
    base = [] if "--task" in args or "-t" in args else ["--task", "sst2"]
    res = run("finetune", *base, *args)
    assert res.exit_code == 0, res.output
    assert value(handed["cfg"], key) == expected


def test_finetune_out_eval_only_config_and_json(handed, tmp_path):
    (tmp_path / "c.yaml").write_text("task: {name: mrpc}\ntrain: {batch_size: 8}\n")
    res = run("finetune", "-c", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "o"), "--eval-only", "--json")
    assert res.exit_code == 0, res.output
    assert handed["cfg"].task.name == "mrpc" and value(handed["cfg"], "train.batch_size") == 8
    assert handed["out"] == str(tmp_path / "o") and handed["eval_only"] is True
    assert '"out_dir": "x"' in res.stdout
    res = run("finetune", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o"), "--epochs", "5")
    assert res.exit_code == 0, res.output
    assert handed["cfg"].train.epochs == 5 and handed["cfg"].task.name == "mrpc"


@pytest.mark.parametrize("key,expected", FINETUNE_KEYS, ids=lambda x: str(x))
def test_every_finetune_key_loads(handed, tmp_path, key, expected):
    section, name = key.split(".")
    text = repr(expected).replace("True", "true") if not isinstance(expected, str) else expected
    assert value(load_finetune_config(None, [f"{key}={text}"]), key) == expected  # --set
    (tmp_path / "c.yaml").write_text(f"{section}: {{{name}: {text}}}\n")
    assert value(load_finetune_config(str(tmp_path / "c.yaml")), key) == expected  # a --config file
    base = [] if key == "task.name" else ["--task", "sst2"]  # a flag beats --set
    res = run("finetune", *base, "--set", f"{key}={text}")
    assert res.exit_code == 0, res.output
    assert value(handed["cfg"], key) == expected


PRETRAIN_FLAGS = [
    (["--max-steps", "7"], lambda g: g["stages"][0].train.max_steps, 7),
    (["--max-tokens", "5000"], lambda g: g["stages"][0].train.max_tokens, 5000),
    (["--compile"], lambda g: g["stages"][0].train.compile, True),
    (["--text-column", "body"], lambda g: g["recipe"].data.text_column, "body"),
    (["--time-budget", "2m"], lambda g: g["time_budget"], 120.0),
    (["--time-budget", "90"], lambda g: g["time_budget"], 90.0),
    (["--stop-after", "3"], lambda g: g["stop_after"], 3),
    (["--streaming"], lambda g: g["streaming"], True),
    (["--data", "a.txt", "-d", "b.txt"], lambda g: g["data"], ["a.txt", "b.txt"]),
    (["--set", "train.seq_len=64"], lambda g: g["stages"][0].train.seq_len, 64),
]


@pytest.mark.parametrize("args,read,expected", PRETRAIN_FLAGS, ids=lambda x: str(x) if not callable(x) else "")
def test_every_pretrain_flag_sets_its_key(handed, tmp_path, args, read, expected):
    res = run("pretrain", "-r", "gpt-mini", "-o", str(tmp_path / "run"), *args)
    assert res.exit_code == 0, res.output
    assert read(handed) == expected
    assert handed["run_dir"].name == "run"


def test_pretrain_flag_beats_set_and_reaches_every_phase(handed, tmp_path):
    res = run("pretrain", "--recipe", "bert-base", "--out", str(tmp_path / "run"), "--set", "train.max_steps=9",
              "--max-steps", "4")
    assert res.exit_code == 0, res.output
    assert len(handed["stages"]) == 2 and {s.train.max_steps for s in handed["stages"]} == {4}
