"""`plm finetune` on a typed config: --config FILE, --set section.key=value, flags as sugar, OUT/finetune.yaml.

Tiny runs on tests/test_finetune.py's bag-of-words encoder and the shipped SST-2 sample.
"""

import json

import pytest
import yaml

from helpers import assert_clean_error, finetune, run
from plmcli.config import FinetuneConfig, load_finetune_config
from plmcli.errors import PlmError
from test_finetune import SAMPLE, families, tokenizer, toy_run  # noqa: F401  (fixtures)

FLAGS = ["--task", "sst2", "--data-dir", SAMPLE, "--max-steps", 5, "--batch-size", 32, "--lr", 0.03, "--seed", 3,
         "--max-seq-len", 32, "--warmup-ratio", 0.2, "--classifier-dropout", 0.05]


def config_yaml(toy_run, **extra) -> str:
    """The YAML that says what FLAGS say."""
    cfg = {"task": {"name": "sst2", "data_dir": str(SAMPLE), "max_seq_len": 32},
           "model": {"from_run": str(toy_run), "classifier_dropout": 0.05},
           "train": {"max_steps": 5, "batch_size": 32, "seed": 3},
           "optim": {"lr": 0.03, "warmup_ratio": 0.2}}
    for key, value in extra.items():
        section, name = key.split("__")
        cfg[section][name] = value
    return yaml.safe_dump(cfg)


def finetune_json(*args) -> dict:
    res = run("finetune", *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("{"):])


def same_run(a: dict, b: dict) -> None:
    """Two finetunes that trained the same, to the last digit."""
    for key in ("dev", "history", "train_loss", "steps", "best_step", "settings", "examples", "init", "from_run"):
        assert a[key] == b[key], key


def test_a_yaml_config_finetunes_as_its_flags_do_and_documents_itself(toy_run, tmp_path):
    by_flags = finetune_json(*FLAGS, "--from", toy_run, "--out", tmp_path / "flags")
    (tmp_path / "sst2.yaml").write_text(config_yaml(toy_run))
    by_file = finetune_json("--config", tmp_path / "sst2.yaml", "--out", tmp_path / "file")  # no --task: the file names it
    same_run(by_flags, by_file)
    assert by_file["settings"]["max_seq_len"] == 32 and by_file["settings"]["warmup_steps"] == 1
    # OUT/finetune.yaml: the resolved config (the run and the data made absolute), the same either way
    written = (tmp_path / "file" / "finetune.yaml").read_text()
    assert written == (tmp_path / "flags" / "finetune.yaml").read_text()
    resolved = yaml.safe_load(written)
    assert resolved["task"]["name"] == "sst2" and resolved["model"]["from_run"] == str(toy_run.resolve())
    assert resolved["task"]["max_seq_len"] == 32 and resolved["optim"]["schedule"] == "linear"
    assert not list((tmp_path / "file").glob(".finetune.yaml.*"))  # written atomically: no temp file left
    # ... and it runs the same finetune again
    again = finetune_json("--config", tmp_path / "file" / "finetune.yaml", "--out", tmp_path / "again")
    same_run(by_file, again)
    # config.json's finetune record is what it was (the task options as given)
    ft = json.loads((tmp_path / "file" / "config.json").read_text())["finetune"]
    assert ft["max_seq_len"] == 32 and ft["options"]["train"] is None and ft["options"]["crf"] is False


def test_precedence_flag_over_set_over_file_over_defaults(toy_run, tmp_path):
    (tmp_path / "c.yaml").write_text(config_yaml(toy_run, train__max_steps=2))
    base = ["--config", tmp_path / "c.yaml"]
    res = finetune_json(*base, "--set", "task.max_seq_len=24", "--out", tmp_path / "a")
    assert res["settings"]["max_seq_len"] == 24 and res["steps"] == 2 and res["settings"]["epochs"] == 3  # default
    res = finetune_json(*base, "--set", "task.max_seq_len=24", "--max-seq-len", 40, "--set", "train.max_steps=1",
                        "--out", tmp_path / "b")
    assert res["settings"]["max_seq_len"] == 40 and res["steps"] == 1
    cfg = yaml.safe_load((tmp_path / "b" / "finetune.yaml").read_text())
    assert cfg["task"]["max_seq_len"] == 40 and cfg["train"]["max_steps"] == 1


def test_the_library_surface_takes_a_config_and_overrides(toy_run, tmp_path):

    (tmp_path / "c.yaml").write_text(config_yaml(toy_run))
    res = finetune(config=str(tmp_path / "c.yaml"), overrides=["train.max_steps=2", "optim.schedule=Cosine"], out=str(tmp_path / "o"))
    assert res["steps"] == 2 and res["task"] == "sst2"
    assert yaml.safe_load((tmp_path / "o" / "finetune.yaml").read_text())["optim"]["schedule"] == "cosine"


def test_config_mistakes_are_one_line_before_anything_runs(toy_run, tmp_path):
    out = tmp_path / "o"
    common = ["--from", toy_run, "--data-dir", SAMPLE, "--out", out]
    (tmp_path / "typo.yaml").write_text("task: {name: sst2}\ntrain: {epoch: 2}\n")
    assert_clean_error(run("finetune", "--config", tmp_path / "typo.yaml", *common),
                       "unknown key 'epoch' in train", "did you mean 'epochs'?")
    (tmp_path / "section.yaml").write_text("task: {name: sst2}\ntrian: {epochs: 2}\n")
    assert_clean_error(run("finetune", "--config", tmp_path / "section.yaml", *common),
                       "unknown key 'trian' in finetune config", "did you mean 'train'?")
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "optim.lrr=1e-3", *common),
                       "unknown key 'lrr' in optim", "did you mean 'lr'?")
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "task.max_length=64", *common),
                       "unknown key 'max_length' in task", "did you mean 'max_seq_len'?")
    # enums: the allowed values, in one line
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "model.init=scratch", *common),
                       "model.init 'scratch' is not one of pretrained, random")
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "optim.schedule=cosinus", *common),
                       "optim.schedule 'cosinus' is not one of linear, cosine")
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "train.mixed_precision=fp8", *common),
                       "train.mixed_precision 'fp8' is not one of auto, no, bf16, fp16")
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "optim.name=adamx", *common),
                       "optim.name 'adamx' is not one of adamw, adam, lamb, sgd")
    # types and ranges, named by key
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "train.epochs=two", *common),
                       "train.epochs = 'two' is not an integer")
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "optim.warmup_ratio=1.5", *common),
                       "optim.warmup_ratio 1.5 must be in [0, 1)")
    assert_clean_error(run("finetune", "--task", "sst2", "--set", "train.micro_batch_size=5", *common),
                       "train.batch_size 32 is not a multiple of train.micro_batch_size 5")
    # a flag's own message names the flag
    assert_clean_error(run("finetune", "--task", "sst2", "--init", "scratch", *common), "--init 'scratch' is not one of")
    # the task: from --task or the file, else one line
    assert_clean_error(run("finetune", *common), "no task given", "--task")
    (tmp_path / "bad.yaml").write_text("task: [sst2\n")
    assert_clean_error(run("finetune", "--config", tmp_path / "bad.yaml", *common), "is not valid YAML")
    assert_clean_error(run("finetune", "--config", tmp_path / "none.yaml", *common), "does not exist")
    assert not out.exists()


def test_load_finetune_config():
    cfg = load_finetune_config(None, ["task.name=sst2", "task.crf=true", "train.epochs=2.0", "optim.lr=1e-4"])
    assert isinstance(cfg, FinetuneConfig) and cfg.train.epochs == 2 and isinstance(cfg.train.epochs, int)
    assert cfg.optim.lr == 1e-4 and cfg.task_options().crf is True and cfg.model.init == "pretrained"
    assert load_finetune_config(None, {"task": {"name": "rte"}}).task.name == "rte"
    assert yaml.safe_load(cfg.to_yaml())["task"]["name"] == "sst2"
    with pytest.raises(PlmError, match="task.crf = 'maybe' is not true or false"):
        load_finetune_config(None, ["task.crf=maybe"])
    # the task options stay importable where the tasks read them
    from plmcli.config_sections import TaskOptions

    assert type(cfg.task_options()) is TaskOptions


def test_finetuning_reads_pretrainings_sections_with_its_own_defaults():
    """One train/optim world: a finetune's train and optim sections are pretraining's classes, FINETUNE_DEFAULTS
    apart, so every pretraining key works in a finetune config (and in OUT/finetune.yaml)."""
    from plmcli.config import FINETUNE_DEFAULTS, OptimConfig, TrainConfig

    cfg = load_finetune_config(None, ["train.compile=true", "optim.betas=[0.9,0.98]", "train.num_workers=2"])
    assert type(cfg.train) is TrainConfig and type(cfg.optim) is OptimConfig
    assert cfg.train.compile is True and cfg.optim.betas == [0.9, 0.98] and cfg.train.num_workers == 2
    for section, defaults in FINETUNE_DEFAULTS.items():
        assert {k: getattr(getattr(cfg, section), k) for k in defaults} == defaults
        assert {k: getattr(getattr(FinetuneConfig(), section), k) for k in defaults} == defaults
    assert load_finetune_config(None, ["train.batch_size=16"]).train.global_batch_size == 16  # the older name
    with pytest.raises(PlmError, match="train.batch_size and train.global_batch_size name one setting"):
        load_finetune_config(None, {"train": {"batch_size": 8, "global_batch_size": 16}})
    with pytest.raises(PlmError, match="train.seq_len is not a finetune setting"):
        load_finetune_config(None, ["train.seq_len=64"])
    assert "seq_len" not in FinetuneConfig().to_dict()["train"]
    assert load_finetune_config(None, {"train.batch_size": 8}, {"train": {"global_batch_size": 4}}).train.global_batch_size == 4


def test_warmup_by_ratio_or_steps_and_what_pretraining_refuses():
    from plmcli.config import OptimConfig, load_recipe

    assert OptimConfig(warmup_ratio=0.1).warmup(100) == 10 and OptimConfig(warmup_ratio=0.0).warmup(100) == 0
    assert OptimConfig(warmup_steps=50).warmup(20) == 20 and OptimConfig(warmup_steps=5).warmup(20) == 5
    assert load_recipe("gpt-mini", ["optim.warmup_ratio=0.25"]).optim.warmup(40) == 10
    for override, message in (("train.epochs=3", "train.epochs 3 is finetuning's: pretraining counts steps"),
                              ("train.max_steps=null", "train.max_steps null must be set for pretraining"),
                              ("optim.lr=null", "optim.lr null must be set for pretraining"),
                              ("train.log_every=0", "train.log_every 0 must be ≥ 1")):
        with pytest.raises(PlmError, match=message):
            load_recipe("gpt-mini", [override])
