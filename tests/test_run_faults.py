"""Runs that are damaged, diverged, finetuned or missing: eval-ppl, finetune --from, generate and export
each refuse them with one line that names the file and what to do, in the command's own way to pass a run."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import assert_clean_error, dirs_under, run, tiny_gpt_run

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "glue-sample"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny GPT run and a GPT-style sst2 finetune of it, made once; tests copy what they damage."""
    root = tmp_path_factory.mktemp("runs")
    with dirs_under(root):
        tiny_gpt_run(root)
        res = run("finetune", "--task", "sst2", "--data-dir", SAMPLE, "--from", root / "gpt", "--out", root / "ft",
                  "--max-steps", 2, "--max-seq-len", 16)
        assert res.exit_code == 0, res.output
    (root / "prompt.txt").write_text("the cat sat on the mat\n", encoding="utf-8")
    return root


def copy(runs, tmp_path, name="gpt") -> Path:
    dest = tmp_path / name
    shutil.copytree(runs / name, dest)
    return dest


def commands(r: Path, tmp_path: Path, text: Path):
    """Each command that reads a run, with it passed the command's way."""
    return {
        "eval-ppl": ["eval-ppl", text, "--model", r],
        "finetune": ["finetune", "--task", "sst2", "--data-dir", SAMPLE, "--from", r, "--max-steps", 1,
                     "--out", tmp_path / "ft-out"],
        "generate": ["generate", r, "--prompt", "the cat", "--max-new-tokens", 3],
        "export": ["export", r, "--format", "hf", "--out", tmp_path / "hf-out"],
    }


def test_the_intact_runs_serve_every_command(runs, tmp_path):
    for name, args in commands(runs / "gpt", tmp_path, runs / "prompt.txt").items():
        res = run(*args)
        assert res.exit_code == 0, (name, res.output)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_weights_are_one_line_for_every_command(runs, tmp_path, damage):
    r = copy(runs, tmp_path)
    weights = r / "model.safetensors"
    blob = weights.read_bytes()
    weights.write_bytes({"truncated": blob[: len(blob) // 2], "garbage": bytes(range(256)) * 8, "empty": b""}[damage])
    for name, args in commands(r, tmp_path, runs / "prompt.txt").items():
        assert_clean_error(run(*args), f"{weights} is damaged", f"plm pretrain --resume --out {r}")
    assert not (tmp_path / "ft-out").exists() and not (tmp_path / "hf-out").exists()


def test_the_hint_for_damaged_weights_works(runs, tmp_path):
    """`plm pretrain --resume` of the finished run rewrites model.safetensors from its last checkpoint."""
    r = copy(runs, tmp_path)
    before = json.loads(run("eval-ppl", runs / "prompt.txt", "--model", r, "--json").stdout)["ppl"]
    (r / "model.safetensors").write_bytes(b"")
    res = run("pretrain", "--resume", "--out", r)
    assert res.exit_code == 0, res.output
    assert json.loads(run("eval-ppl", runs / "prompt.txt", "--model", r, "--json").stdout)["ppl"] == before


@pytest.mark.parametrize("config, needle", [
    ("{not json", "not JSON"),
    ('{"model": {}}', "needs a 'family' name and a 'model' section"),
    ('["gpt"]', "needs a 'family' name"),
    ('{"family": "gtp", "model": {}}', "unknown model family 'gtp'"),
    ('{"family": "gpt", "model": {"n_layr": 2}}', "unknown key 'n_layr'"),
    ('{"family": "gpt", "model": {"n_layer": "two"}}', "model.n_layer"),
])
def test_damaged_config_is_one_line_for_every_command(runs, tmp_path, config, needle):
    r = copy(runs, tmp_path)
    (r / "config.json").write_text(config, encoding="utf-8")
    for name, args in commands(r, tmp_path, runs / "prompt.txt").items():
        assert_clean_error(run(*args), f"{r / 'config.json'} is damaged", needle, "re-run the pretrain")


def test_a_model_section_that_cannot_be_built(runs, tmp_path):
    r = copy(runs, tmp_path)
    cfg = json.loads((r / "config.json").read_text())
    cfg["model"]["n_head"] = 5  # d_model 32 is not a multiple of it
    (r / "config.json").write_text(json.dumps(cfg))
    for name, args in commands(r, tmp_path, runs / "prompt.txt").items():
        assert_clean_error(run(*args), f"{r / 'config.json'} is damaged")


def test_weights_of_another_shape_do_not_fit(runs, tmp_path):
    r = copy(runs, tmp_path)
    tensors = load_file(str(r / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.endswith(".bias")}, str(r / "model.safetensors"))
    assert_clean_error(run("eval-ppl", runs / "prompt.txt", "--model", r), "do not fit its config.json")


def test_non_finite_weights_are_refused(runs, tmp_path):
    r = copy(runs, tmp_path)
    tensors = load_file(str(r / "model.safetensors"))
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(r / "model.safetensors"))
    for cmd in ("eval-ppl", "generate", "finetune", "export"):
        assert_clean_error(run(*commands(r, tmp_path, runs / "prompt.txt")[cmd]),
                           f"the weights of run {r} hold NaN/inf (1 tensor, e.g. {name})", "optim.lr")
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, str(r / "model.safetensors"))
    assert_clean_error(run("eval-ppl", runs / "prompt.txt", "--model", r), "NaN/inf")


def test_a_finetuned_run_names_its_pretrained_run(runs, tmp_path):
    ft, source = runs / "ft", (runs / "gpt").resolve()
    assert json.loads((ft / "config.json").read_text())["finetune"]["from_run"] == str(source)
    assert_clean_error(run("eval-ppl", runs / "prompt.txt", "--model", ft),
                       f"run {ft} is finetuned on sst2", f"score text with the run it was finetuned from: --model {source}")
    assert_clean_error(run("generate", ft, "--prompt", "the"),
                       "is finetuned on sst2", f"generate with the run it was finetuned from: `plm generate {source}`")
    # What it names works, and the finetuned run itself still exports and finetunes further.
    assert run("eval-ppl", runs / "prompt.txt", "--model", source).exit_code == 0
    assert run("export", ft, "--format", "hf", "--out", tmp_path / "hf").exit_code == 0


def test_damaged_finetuned_weights_say_run_the_finetune_again(runs, tmp_path):
    ft = copy(runs, tmp_path, "ft")
    (ft / "model.safetensors").write_bytes(b"\x00" * 40)
    assert_clean_error(run("export", ft, "--format", "hf", "--out", tmp_path / "hf"), "is damaged", "run the finetune again")
    assert_clean_error(run("finetune", "--task", "sst2", "--data-dir", SAMPLE, "--from", ft, "--eval-only"),
                       "is damaged", "run the finetune again")


def test_hints_name_each_commands_way_to_pass_a_run(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("a b\n")
    ways = {"eval-ppl": ["eval-ppl", text], "finetune": ["finetune", "--task", "sst2", "--data-dir", SAMPLE],
            "generate": ["generate", "--prompt", "a"], "export": ["export", "--format", "hf", "--out", tmp_path / "o"]}
    usage = {"eval-ppl": "pass --model RUN", "finetune": "pass --from RUN", "generate": "pass `plm generate RUN`",
             "export": "pass `plm export RUN`"}
    for name, args in ways.items():
        assert_clean_error(run(*args), "no run given and runs/latest does not exist", usage[name])
        res = run(*args[:1], *(["--model", tmp_path] if name == "eval-ppl" else ["--from", tmp_path] if name == "finetune"
                               else [tmp_path]), *args[1:])
        assert_clean_error(res, f"{tmp_path} is not a plm run directory", usage[name])
    for name, args in ways.items():
        assert "RUN_DIR" not in run(*args).stderr


def test_a_run_without_weights_names_its_path(runs, tmp_path):
    r = copy(runs, tmp_path)
    (r / "model.safetensors").unlink()
    assert_clean_error(run("generate", r, "--prompt", "a"), "has no model.safetensors yet", f"plm pretrain --resume --out {r}")


def test_api_load_run_refuses_the_same_way(runs, tmp_path):
    from plmcli import api
    from plmcli.errors import PlmError

    r = copy(runs, tmp_path)
    (r / "model.safetensors").write_bytes(b"nonsense")
    with pytest.raises(PlmError, match="is damaged"):
        api.load_run(str(r))
    model, tok, cfg = api.load_run(str(runs / "gpt"))
    assert not model.training and cfg["family"] == "gpt" and tok.get_vocab_size() > 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_loading_a_run_draws_no_init_and_holds_exactly_its_weights(runs):
    from torch.nn import init

    from plmcli.runs import load_run_model

    cfg = json.loads((runs / "gpt" / "config.json").read_text())
    fillers = {n: getattr(init, n) for n in ("normal_", "uniform_", "zeros_", "ones_", "kaiming_uniform_")}
    torch.manual_seed(0)
    before = torch.get_rng_state()
    model = load_run_model(runs / "gpt", cfg)
    assert torch.equal(torch.get_rng_state(), before)  # building drew nothing: the file holds every weight
    saved = load_file(runs / "gpt" / "model.safetensors")
    state = model.state_dict()
    assert saved and all(torch.equal(state[k], v) for k, v in saved.items())
    assert {n: getattr(init, n) for n in fillers} == fillers  # torch.nn.init is itself again afterwards


def test_a_failed_build_without_init_restores_torch_init():
    from torch.nn import init

    from plmcli.models.gpt import GPTConfig
    from plmcli.models.registry import build_model
    from plmcli.models.skip_init import NoRandomInit

    normal = init.normal_
    with pytest.raises(ValueError, match="vocab_size must be set"):
        with NoRandomInit():
            build_model("gpt", GPTConfig())
    assert init.normal_ is normal
    torch.manual_seed(0)
    built = build_model("gpt", GPTConfig(vocab_size=11, max_positions=8, n_layer=1, n_head=2, d_model=8))
    torch.manual_seed(0)
    again = build_model("gpt", GPTConfig(vocab_size=11, max_positions=8, n_layer=1, n_head=2, d_model=8))
    assert torch.equal(built.wte.weight, again.wte.weight) and float(built.wte.weight.detach().std()) > 0.01  # initialised


def test_a_tokenizer_bigger_than_the_model_is_one_line_for_every_command(runs, tmp_path):
    """tokenizer.json swapped for one with more tokens than the model's embedding: was an IndexError in eval-ppl."""
    from tokenizers import Tokenizer

    r = copy(runs, tmp_path)
    tok = Tokenizer.from_file(str(r / "tokenizer.json"))
    tok.add_tokens([f"extra{i}" for i in range(300)])
    tok.save(str(r / "tokenizer.json"))
    for name, args in commands(r, tmp_path, runs / "prompt.txt").items():
        assert_clean_error(run(*args), f"its tokenizer.json has {tok.get_vocab_size():,} tokens but the model only",
                           "put back the tokenizer.json")


def test_eval_ppl_of_only_whitespace_is_one_line(runs, tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("  \n\n \t\n", encoding="utf-8")
    assert_clean_error(run("eval-ppl", blank, "--model", runs / "gpt"), f"{blank}: no words to score")
