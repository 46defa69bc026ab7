"""Shared test fixtures: a tiny corpus and a tiny recipe that train in a second or two."""

import contextlib
import math
from pathlib import Path

from benchmarks.common import free_port, tiny_corpus  # noqa: F401 (the tests' fixtures too)

TINY_RECIPE = """\
extends: gpt-mini
model: {n_layer: 2, n_head: 2, d_model: 32, max_positions: 32, dropout: 0.1, attn_dropout: 0.0}
tokenizer: {kind: char, vocab_size: 200, min_frequency: 1, special_tokens: {eos: "<eos>", unk: "<unk>"}}
data: {val_fraction: 0.2}
train: {seq_len: 16, global_batch_size: 4, max_steps: 6, eval_every: 3, eval_batches: 2, save_every: 3, log_every: 1}
optim: {lr: 3.0e-3, warmup_steps: 2, schedule: cosine}
"""


def tiny_recipe(path: Path) -> Path:
    path.write_text(TINY_RECIPE, encoding="utf-8")
    return path


def run(*args):
    """`plm ARGS...` in process, through Typer's CliRunner (stdout and stderr apart)."""
    from typer.testing import CliRunner

    from plmcli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


@contextlib.contextmanager
def dirs_under(root: Path):
    """PLM_RUNS and PLM_CACHE under `root`, for module-scoped fixtures (conftest isolates each test)."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLM_RUNS", str(root / "runs"))
        mp.setenv("PLM_CACHE", str(root / "cache"))
        yield


def tiny_gpt_run(root: Path) -> Path:
    """root/gpt: the tiny recipe (root/tiny.yaml) pretrained on the tiny corpus (root/c.txt)."""
    res = run("pretrain", "--recipe", tiny_recipe(root / "tiny.yaml"), "--data", tiny_corpus(root / "c.txt"),
              "--out", root / "gpt")
    assert res.exit_code == 0, res.output
    return root / "gpt"


def pretrained_on(root: Path, text: str, max_positions: int = 64, steps: int = 3) -> Path:
    """root/run: the tiny recipe (TINY_RECIPE, its positions set) pretrained `steps` steps on `text`, its runs dir and
    cache inside root (a module-scoped fixture has no per-test PLM_RUNS / PLM_CACHE)."""
    import pytest

    from plmcli import api

    (root / "corpus.txt").write_text(text)
    (root / "tiny.yaml").write_text(TINY_RECIPE.replace("max_positions: 32", f"max_positions: {max_positions}"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLM_RUNS", str(root / "runs"))
        mp.setenv("PLM_CACHE", str(root / "cache"))
        api.pretrain(str(root / "tiny.yaml"), [str(root / "corpus.txt")], str(root / "run"), {"train.max_steps": steps})
    return root / "run"


def assert_clean_error(res, *needles):
    """Exit 2, exactly one line on stderr starting `error:`, no traceback, and each needle in it."""
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in res.output
    for n in needles:
        assert n in err, err


# A stand-in encoder family for CLI checks that need a run that is not a causal LM.
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402

from plmcli.models.base import LanguageModel  # noqa: E402


@dataclass
class ToyEncoderConfig:
    vocab_size: int = 0
    max_positions: int = 32
    d_model: int = 8


class ToyEncoder(LanguageModel):
    Config = ToyEncoderConfig

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.emb = torch.nn.Embedding(max(cfg.vocab_size, 1), cfg.d_model)

    def forward(self, input_ids):
        return self.emb(input_ids)


# Encoder-decoder runs: a word-reversal "translation" task ("a b c<TAB>c b a") that a tiny model learns in seconds.
S2S_SPECIALS = '{pad: "<pad>", unk: "<unk>", mask: "<mask>", bos: "<s>", eos: "</s>"}'
S2S_MODELS = {
    "seq2seq": "{family: seq2seq, cell: gru, d_embed: 32, d_hidden: 128, attention: additive, dropout: 0.0, max_positions: 16}",
    "transformer": "{family: transformer, n_encoder_layers: 1, n_decoder_layers: 1, d_model: 32, d_ff: 128, n_head: 2, "
                   "dropout: 0.0, max_positions: 16}",
}


def reverse_pairs(path: Path, n: int = 600, seed: int = 0, letters: str = "a b c d e f g h") -> Path:
    import random

    rng, words = random.Random(seed), letters.split()
    lines = []
    for _ in range(n):
        w = [rng.choice(words) for _ in range(rng.randint(3, 5))]
        lines.append(" ".join(w) + "\t" + " ".join(reversed(w)))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tiny_s2s_recipe(path: Path, family: str = "seq2seq", max_steps: int = 250, objective: str = "translation") -> Path:
    base = {"seq2seq": "seq2seq-attn-mini", "transformer": "transformer-mini"}[family]
    path.write_text(f"""\
extends: {base}
model: {S2S_MODELS[family]}
tokenizer: {{kind: word, vocab_size: 100, min_frequency: 1, special_tokens: {S2S_SPECIALS}}}
data: {{val_fraction: 0.1}}
objective: {{name: {objective}, label_smoothing: 0.0}}
train: {{seq_len: 16, global_batch_size: 32, max_steps: {max_steps}, eval_every: 0, eval_batches: 0, save_every: 0, log_every: 50}}
optim: {{name: adam, lr: 1.0e-2, warmup_steps: 10, schedule: cosine, min_lr_ratio: 0.0, betas: [0.9, 0.98]}}
""", encoding="utf-8")
    return path


def _addmm_inplace_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def _onednn_linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(x_shape) * w_shape[0]


def counted_flops(fn) -> int:
    """FLOPs of every matmul fn() runs, forward and backward, as torch's FlopCounterMode counts them. On a
    CPU the counter does not see SDPA's fused kernel: record_attention (layers' attention) and the math
    backend (XLNet's) make its matmuls explicit. It has no formula for the in-place `addmm_` the fused LM
    loss accumulates its weight gradient with, nor for oneDNN's linear (plmcli.kernels), so those are given."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from plmcli.models.layers import record_attention

    mapping = {torch.ops.aten.addmm_: _addmm_inplace_flops}
    if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        mapping[torch.ops.mkldnn._linear_pointwise] = _onednn_linear_flops
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter, \
            record_attention(), sdpa_kernel(SDPBackend.MATH):
        fn()
    return counter.get_total_flops()


def finetune(task: str | None = None, from_run=None, data_dir=None, out=None, *, eval_only: bool = False, console=None,
             config=None, overrides=None, options=None, **keys) -> dict:
    """plmcli.api.finetune of the config that names the task, the run and its data, with `keys` — config keys
    written with `__` for the dot (train__max_steps=3, optim__lr=1e-2, grid__lr=[1e-3, 1e-4]) — over `overrides`
    over the file `config`; `options`: task options (a TaskOptions or a dict), the fields a caller set."""
    from dataclasses import asdict

    from plmcli import api
    from plmcli.config import override_layers
    from plmcli.config_sections import TaskOptions

    if isinstance(options, TaskOptions):
        options = {k: v for k, v in asdict(options).items() if v != getattr(TaskOptions(), k)}
    given = {"task.name": task, "model.from_run": from_run, "task.data_dir": data_dir,
             **{f"task.{k}": v for k, v in (options or {}).items()}, **{k.replace("__", "."): v for k, v in keys.items()}}
    cfg = api.finetune_config(config, override_layers(overrides, {k: v for k, v in given.items() if v is not None}))
    return api.finetune(cfg, out, eval_only=eval_only, console=console)


def recorded_feeds(monkeypatch, cls) -> list:
    """Every training batch's input_ids (a CPU copy), in the order the loop fed them to objective class `cls`'s
    step (evaluation excluded): what an interrupted and resumed run must feed again, batch for batch."""
    seen = []
    step = cls.step

    def recording(self, model, batch, state=None):
        if model.training:
            seen.append(batch["input_ids"].detach().cpu().clone())
        return step(self, model, batch, state)

    monkeypatch.setattr(cls, "step", recording)
    return seen
