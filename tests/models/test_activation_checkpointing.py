"""train.activation_checkpointing: with dropout on, every Transformer family's loss and gradients are the plain
path's (the recomputed blocks draw the same dropout masks), while each block's forward runs once more in backward."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from plmcli.config import load_finetune_config, load_recipe
from plmcli.errors import PlmError
from plmcli.models import layers
from plmcli.models.base import CheckpointsActivations, HasLayerStates
from plmcli.models.checkpointing import apply_activation_checkpointing
from plmcli.models.registry import FAMILIES, model_class
from plmcli.models.spanbert import SpanBertOutput

B, T, V = 2, 8, 50
DROP = {"dropout": 0.2}


def ids(seed: int = 1, shape=(B, T)) -> torch.Tensor:
    return torch.randint(5, V, shape, generator=torch.Generator().manual_seed(seed))


def padding() -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 6:] = 0  # a padded row: the key mask (or the unpadded path) is part of what is checkpointed
    return mask


MASKED = torch.tensor([2, 3, 5, T + 1, T + 2, T + 4])
"""Flat b·T + t positions of masked tokens: spans with a boundary on each side (SpanBERT's SBO reads them)."""


def masked_lm(model) -> torch.Tensor:
    x = ids()
    out = model(x, torch.zeros_like(x), padding(), mlm_positions=MASKED, mlm_labels=x.flatten()[MASKED])
    loss = out.mlm_loss
    for logits, classes in ((out.nsp_logits, 2), (out.reorder_logits, 9), (out.distance_logits, 3)):
        if logits is not None:
            loss = loss + F.cross_entropy(logits, torch.arange(B) % classes)
    if isinstance(out, SpanBertOutput):  # SpanBERT's span-boundary predictions
        assert len(out.sbo_index)
        loss = loss + F.cross_entropy(out.sbo_logits, x.flatten()[MASKED][out.sbo_index])
    return loss


def causal_lm(model) -> torch.Tensor:
    x = ids()
    return model(x, labels=x)


def electra(model) -> torch.Tensor:
    x = ids()
    gen = model(x, torch.zeros_like(x), padding(), mlm_positions=MASKED, part="generator")
    replaced = (ids(2) % 2).float()
    disc = model(x, torch.zeros_like(x), padding(), part="discriminator")
    return F.cross_entropy(gen.mlm_logits, x.flatten()[MASKED]) + F.binary_cross_entropy_with_logits(disc.rtd_logits,
                                                                                                     replaced)


def segments(model) -> torch.Tensor:
    """Two consecutive segments, the second attending to the memory the first left."""
    a, b = ids(1), ids(2)
    nll_a, mems = model(a, None, labels=a)
    nll_b, mems = model(b, mems, labels=b)
    assert mems is not None
    return nll_a.mean() + nll_b.mean()


def permutation_lm(model) -> torch.Tensor:
    """XLNet's pretraining forward: a random factorisation order, the query stream at 3 targets, over two
    segments that carry a memory (each segment caching its first reuse_len states)."""
    loss, mems = 0.0, None
    for seed in (1, 2):
        x = ids(seed)
        g = torch.Generator().manual_seed(seed)
        order = torch.stack([torch.randperm(T, generator=g) for _ in range(B)])  # rank of each position
        perm_mask = (order[:, None, :] >= order[:, :, None]).float()  # i may not see j unless j comes before it
        targets = torch.stack([torch.randperm(T, generator=g)[:3] for _ in range(B)])  # (B, 3)
        mapping = F.one_hot(targets, T).float()
        logits, mems = model(x, torch.zeros_like(x), perm_mask, mapping, mems, reuse_len=6)
        loss = loss + F.cross_entropy(logits.flatten(0, 1), x.gather(1, targets).flatten())
    assert mems is not None
    return loss


def translation(model) -> torch.Tensor:
    src, tgt = ids(1), ids(2, (B, T + 1))
    return F.cross_entropy(model(src, padding().bool(), tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())


@dataclass
class Case:
    family: str
    config: dict
    loss: Callable
    blocks: Callable
    """The modules each of which runs once per block (ALBERT: its attention sublayer, shared or not)."""


ENCODER = {"n_layer": 2, "d_model": 16, "n_head": 2, "d_ff": 32, "max_positions": 16, "attn_dropout": 0.1, **DROP}
CASES = {
    "gpt2": Case("gpt", {"n_layer": 2, "d_model": 16, "n_head": 2, "max_positions": 16, "attn_dropout": 0.1, **DROP},
                 causal_lm, lambda m: m.blocks),
    "gpt1": Case("gpt", {"n_layer": 2, "d_model": 16, "n_head": 2, "max_positions": 16, "norm_position": "post",
                         "final_norm": False, **DROP}, causal_lm, lambda m: m.blocks),
    "bert": Case("bert", ENCODER, masked_lm, lambda m: m.blocks),
    "bert-pre-ln": Case("bert", {**ENCODER, "norm_position": "pre"}, masked_lm, lambda m: m.blocks),
    "roberta": Case("bert", {**ENCODER, "max_positions": 18, "position_offset": 2, "type_vocab_size": 1,
                             "nsp_head": False}, masked_lm, lambda m: m.blocks),
    "ernie2": Case("bert", {**ENCODER, "reorder_classes": 9, "distance_classes": 3}, masked_lm, lambda m: m.blocks),
    "spanbert": Case("spanbert", {**ENCODER, "sbo_d_position": 8}, masked_lm, lambda m: m.blocks),
    "albert": Case("albert", {**ENCODER, "embedding_size": 8}, masked_lm, lambda m: m.attention),
    "albert-unshared": Case("albert", {**ENCODER, "embedding_size": 8, "share": "none"}, masked_lm,
                            lambda m: m.attention),
    "nezha": Case("nezha", {**ENCODER, "max_relative_position": 4}, masked_lm, lambda m: m.blocks),
    "electra": Case("electra", {**ENCODER, "n_head": 4, "embedding_size": 8, "generator_size": 0.5}, electra,
                    lambda m: [*m.generator.blocks, *m.discriminator.blocks]),
    "xlnet": Case("xlnet", {**ENCODER, "mem_len": 6}, permutation_lm, lambda m: m.blocks),
    "transformer_xl": Case("transformer_xl", {"n_layer": 2, "d_model": 16, "n_head": 2, "d_ff": 32, "mem_len": 4,
                                              "attn_dropout": 0.1, "cutoffs": [], **DROP}, segments, lambda m: m.layers),
    "transformer": Case("transformer", {"n_encoder_layers": 2, "n_decoder_layers": 2, "d_model": 16, "n_head": 2,
                                        "d_ff": 32, "max_positions": 16, "attn_dropout": 0.1, **DROP}, translation,
                        lambda m: [*m.encoder, *m.decoder]),
}


def build(case: Case):
    cls = model_class(case.family)
    torch.manual_seed(0)
    return cls(cls.Config(vocab_size=V, **case.config)).train()


@contextmanager
def block_inputs(blocks):
    """The first argument of every block forward run while inside (a pre-hook: a recomputation that stops early,
    once it has every activation backward needs, still counts)."""
    seen = []
    hooks = [b.register_forward_pre_hook(lambda module, args: seen.append(args[0])) for b in blocks]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def step(model, loss_fn, blocks, on: bool):
    """(loss, every parameter's gradient, block forwards run) of one training step, dropout seeded alike."""
    apply_activation_checkpointing(model, on)
    model.zero_grad(set_to_none=True)
    with block_inputs(blocks) as seen:
        torch.manual_seed(7)
        loss = loss_fn(model)
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, len(seen)


def assert_same_step(plain, checkpointed):
    loss, grads, _ = plain
    loss_c, grads_c, _ = checkpointed
    torch.testing.assert_close(loss_c, loss, rtol=0, atol=0)
    assert grads_c.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


def test_every_transformer_family_checkpoints_and_has_a_case():
    able = {f for f in FAMILIES if issubclass(model_class(f), CheckpointsActivations)}
    assert able == {"gpt", "bert", "spanbert", "albert", "nezha", "electra", "xlnet", "transformer_xl", "transformer"}
    assert able == {c.family for c in CASES.values()}


@pytest.mark.parametrize("name", list(CASES))
def test_checkpointed_step_equals_the_plain_one(name):
    case = CASES[name]
    model = build(case)
    plain = step(model, case.loss, case.blocks(model), on=False)
    after_plain = torch.get_rng_state()
    checkpointed = step(model, case.loss, case.blocks(model), on=True)
    assert_same_step(plain, checkpointed)
    assert plain[1], "no gradient reached the parameters"
    # every block's forward ran once more, in backward: the activations were recomputed, not kept
    assert plain[2] >= len(case.blocks(model)) and checkpointed[2] == 2 * plain[2]
    # the recomputation drew its masks from a restored copy of the generator: the draws after the step (the
    # next micro-batch's) are the plain run's
    assert torch.equal(torch.get_rng_state(), after_plain)


def layer_state_loss(model) -> torch.Tensor:
    x = ids()
    states = model.layer_states(x, torch.zeros_like(x), padding())
    return sum((j + 1) * h.square().mean() for j, h in enumerate(states))


@pytest.mark.parametrize("name", [n for n in CASES if issubclass(model_class(CASES[n].family), HasLayerStates)])
def test_layer_states_backpropagate_the_same(name):
    """Feature-based transfer reads every block's output; with checkpointing those are the same, and so are their
    gradients."""
    case = CASES[name]
    model = build(case)
    plain = step(model, layer_state_loss, case.blocks(model), on=False)
    checkpointed = step(model, layer_state_loss, case.blocks(model), on=True)
    assert_same_step(plain, checkpointed)
    assert checkpointed[2] == 2 * plain[2] > 0


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")  # the CPU's jagged SDPA kernel
def test_unpadded_encoder_checkpoints(monkeypatch):
    """A GPU runs a padded batch's encoder on jagged (unpadded) states: those are checkpointed alike."""
    monkeypatch.setattr(layers, "unpadded_attention", lambda device: True)
    case = CASES["bert"]
    model = build(case)
    with block_inputs(model.blocks) as seen:
        plain = step(model, case.loss, case.blocks(model), on=False)
    assert seen and all(x.is_nested for x in seen)
    assert_same_step(plain, step(model, case.loss, case.blocks(model), on=True))


def test_without_autograd_nothing_is_recomputed():
    """Evaluation, scoring and generation run under no_grad: a checkpointed model runs each block once."""
    model = build(CASES["gpt2"])
    apply_activation_checkpointing(model, True)
    with torch.no_grad(), block_inputs(model.blocks) as seen:
        model(ids())
    assert len(seen) == len(model.blocks)


def test_a_family_without_blocks_is_refused_in_one_line():
    cls = model_class("rnn")
    rnn = cls(cls.Config(vocab_size=V, d_embed=8, d_hidden=8))
    with pytest.raises(PlmError, match="needs a Transformer family; rnn has no blocks to checkpoint") as e:
        apply_activation_checkpointing(rnn, True)
    assert "train.activation_checkpointing=false" in e.value.hint and "gpt" in e.value.hint
    assert "\n" not in str(e.value)
    apply_activation_checkpointing(rnn, False)  # off asks nothing of the model
    with pytest.raises(PlmError, match="Linear has no blocks"):
        apply_activation_checkpointing(nn.Linear(2, 2), True)


def test_a_task_model_around_a_family_is_switched():
    """finetune trains a task model that holds the family: the switch reaches it (and through a wrapper, DDP's)."""
    model = build(CASES["gpt2"])
    task = nn.Sequential(nn.Identity(), nn.ModuleDict({"backbone": model}))
    apply_activation_checkpointing(task, True)
    assert model.activation_checkpointing
    apply_activation_checkpointing(task, False)
    assert not model.activation_checkpointing


def test_the_setting_loads_from_a_recipe_and_a_finetune_config():
    from plmcli.pipelines.finetune import loop_config

    assert load_recipe("gpt-mini").train.activation_checkpointing is False
    assert load_recipe("gpt-mini", ["train.activation_checkpointing=true"]).train.activation_checkpointing is True
    cfg = load_finetune_config(None, ["train.activation_checkpointing=true", "train.epochs=1"])
    assert cfg.train.activation_checkpointing is True
    assert loop_config(cfg, 10).train.activation_checkpointing is True  # carried into what THE loop reads
    with pytest.raises(PlmError, match="activation_checkpointing"):
        load_recipe("gpt-mini", ["train.activation_checkpointng=true"])


def test_pretrain_with_checkpointing_trains_the_same_weights(tmp_path):
    """Through THE loop (dropout on, 3 optimizer steps): the weights equal a run without it, bitwise."""
    from safetensors.torch import load_file

    from helpers import tiny_corpus, tiny_recipe
    from plmcli import api

    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    over = ["train.max_steps=3", "train.eval_every=0"]
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "plain"), overrides=over)
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "ckpt"), overrides=over + ["train.activation_checkpointing=true"])
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("plain", "ckpt"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pretrain_refuses_it_for_a_family_without_blocks(tmp_path):
    from helpers import tiny_corpus
    from plmcli import api

    with pytest.raises(PlmError, match="needs a Transformer family; ngram has no blocks"):
        api.pretrain("ngram-kn5", [str(tiny_corpus(tmp_path / "c.txt"))], str(tmp_path / "run"),
                     overrides=["train.activation_checkpointing=true"])
