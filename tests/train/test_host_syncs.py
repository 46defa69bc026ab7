"""A training step never waits for the host on the code path a GPU takes (ARCHITECTURE.md, "GPU first").

On a GPU a host read (`.item()`, `bool(t)`, `.cpu()`, boolean-mask indexing, `nonzero`, a tensor made from
Python data) stalls the host until every queued kernel has run. Here each pretraining family that trains
through the loop, and each finetune head, runs two optimizer steps on a CPU with plm's CPU-only kernels switched
off (`plmcli.kernels.switched(False)`), and every host read inside the objective's `step` (forward and loss)
and `accelerator.backward` is counted; the batch is built outside them. A TorchDispatchMode sees the ops that
read; `.cpu()`, `.numpy()` and `.tolist()` of a CPU tensor reach no op, so those methods are watched themselves.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import tiny_corpus
from plmcli import kernels
from test_finetune_matrix import ALL_TASKS, tiny_run, tokenizer, write_data  # noqa: F401 (tokenizer: a fixture)
from families import tiny_overrides

pytestmark = pytest.mark.usefixtures("one_thread")

aten = torch.ops.aten

READS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.equal, aten.is_nonzero, aten.lift_fresh,
         aten.lift_fresh_copy, aten.unique_consecutive, aten._unique2, aten.unique_dim, aten.bincount, aten.allclose}
"""Ops whose result needs the host: a scalar read, an output sized by the data, a tensor made from Python data."""
INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
"""Ops that read the host when an index is boolean (a mask becomes its nonzero positions)."""
METHODS = ("cpu", "numpy", "tolist")
"""Tensor methods that copy to the host: on a CPU tensor no op a dispatch mode sees."""
HOST_SIDE = ("torch/nn/utils/rnn.py", "torch/nn/modules/rnn.py")
"""torch's packing of RNN input: PackedSequence's batch sizes (and the lengths they come from) live on the host in
every run, CUDA's RNN kernels included, so reading them there waits for no device."""

STATE = {"counting": 0, "paused": 0, "jagged": 0}
"""counting: inside a training step's step() or backward(); paused: inside a CPU stand-in for a CUDA kernel
(`varlen_sdpa`), whose reads are its own; jagged: unpadded attention calls seen while counting."""


def _is_read(func, args, kwargs) -> bool:
    packet = func.overloadpacket
    if packet in READS:
        return True
    if packet is aten.repeat_interleave:  # repeats from a tensor: the output length is their sum
        return torch.is_tensor(args[0]) and kwargs.get("output_size") is None and (len(args) < 3 or args[2] is None)
    if packet in INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(i is not None and i.dtype == torch.bool for i in indices)
    return False


def _note(log: list, what: str) -> None:
    """Log a host read `what` with the plm line that made it, unless it is torch's own host-side RNN packing."""
    if not STATE["counting"] or STATE["paused"]:
        return
    stack = traceback.extract_stack()
    if any(f.filename.replace("\\", "/").endswith(HOST_SIDE) for f in stack):
        return
    ours = [f for f in stack if "/plmcli/" in f.filename]
    log.append(f"{what} at {Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else f"{what} at ?")


class HostReads(TorchDispatchMode):
    """While active: the region being counted; host-reading ops go to `log`."""

    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def __enter__(self):
        STATE["counting"] += 1
        return super().__enter__()

    def __exit__(self, *exc):
        STATE["counting"] -= 1
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_read(func, args, kwargs):
            _note(self.log, str(func))
        return func(*args, **kwargs)


def varlen_sdpa(q, k, v, *args, sdpa=torch.nn.functional.scaled_dot_product_attention, **kwargs):
    """SDPA, whose jagged (unpadded) inputs a CPU attends through torch's math fallback, which splits the rows on the
    host. CUDA's flash and memory-efficient variable-length kernels read the rows' longest and shortest length
    cached on the jagged tensors instead: that they are cached is checked here, and the fallback's reads not counted."""
    if not q.is_nested:
        return sdpa(q, k, v, *args, **kwargs)
    if STATE["counting"]:  # a training step (outside one, as in evaluation, a read is allowed)
        STATE["jagged"] += 1
        for t in (q, k, v):
            assert t._maybe_max_seqlen is not None and t._maybe_min_seqlen is not None, "CUDA would read the lengths"
    STATE["paused"] += 1
    try:
        return sdpa(q, k, v, *args, **kwargs)
    finally:
        STATE["paused"] -= 1


@pytest.fixture
def counted(monkeypatch):
    """The CUDA path forced on the CPU; yields (host reads in training steps, micro-batches): the lists fill as
    pretrain or finetune runs. Evaluation (no gradient) is not counted."""
    import accelerate

    import plmcli.train.loop as loop

    log: list = []
    micro = [0]

    def backward(self, loss, **kw):
        micro[0] += 1
        with HostReads(log):
            return real_backward(self, loss, **kw)

    def train(recipe, model, objective, *args, **kw):
        real_step = objective.step

        def step(*a, **k):
            if not torch.is_grad_enabled():
                return real_step(*a, **k)
            with HostReads(log):
                return real_step(*a, **k)

        objective.step = step
        return real_train(recipe, model, objective, *args, **kw)

    def watched(name: str):
        real = getattr(torch.Tensor, name)

        def method(self, *a, **k):
            _note(log, f"Tensor.{name}()")
            return real(self, *a, **k)

        return method

    real_backward, real_train = accelerate.Accelerator.backward, loop.train
    monkeypatch.setattr(accelerate.Accelerator, "backward", backward)
    monkeypatch.setattr(loop, "train", train)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", varlen_sdpa)
    for name in METHODS:
        monkeypatch.setattr(torch.Tensor, name, watched(name))
    monkeypatch.setitem(STATE, "jagged", 0)
    with kernels.switched(False):
        yield log, micro


def _report(log: list, micro: list) -> str:
    return f"{len(log) / max(micro[0], 1):.1f} host reads per micro-batch:\n" + "\n".join(sorted(set(log)))


STEPS = ["train.seq_len=16", "train.max_steps=2", "train.global_batch_size=4", "train.log_every=1000",
         "train.eval_every=0", "train.save_every=0"]

PRETRAIN = {  # recipe[:variant]: (family for the tiny size, more overrides); masking variants differ on the host only
    "gpt-mini": ("gpt", []),
    "nnlm-ptb": ("nnlm", []),
    "bert-mini": ("bert", []),  # static masking, NSP
    "roberta-mini": ("bert", ["train.micro_batch_size=0", "model.max_positions=18"]),  # dynamic, full sentences
    "albert-mini": ("albert", []),  # n-gram masking, SOP
    "spanbert-mini": ("spanbert", []),  # spans, SBO
    "nezha-mini": ("nezha", []),
    "electra-mini": ("electra", []),
    "ernie2-mini": ("bert", []),
    "xlnet-mini": ("xlnet", ["data.val_fraction=0.5"]),
    "txl-mini": ("transformer_xl", []),
    "txl-mini:adaptive": ("transformer_xl", ["model.cutoffs=[100,200]", "model.div_val=2"]),  # adaptive in/softmax
    "lstm-ptb-small": ("rnn", []),
    "elmo-mini": ("elmo", []),
    "transformer-mini-denoising": ("transformer", []),
    "seq2seq-attn-mini": ("seq2seq", []),
    "seq2seq-bahdanau-mini": ("seq2seq", []),
    "transformer-mini": ("transformer", []),
}
PARALLEL = {"seq2seq-attn-mini", "seq2seq-bahdanau-mini", "transformer-mini"}
"""Recipes that read source<TAB>target pairs."""
UNPADDED = {"roberta-mini", "ernie2-mini"}
"""Recipes whose padded batches an encoder runs unpadded on a GPU (models/layers.py: bidirectional)."""


@pytest.mark.parametrize("name", sorted(PRETRAIN))
def test_pretraining_step_reads_nothing_from_the_host(name, counted, tmp_path):
    from plmcli.api import pretrain

    log, micro = counted
    family, extra = PRETRAIN[name]
    tiny = [o for o in tiny_overrides(family) if not o.startswith("model.vocab_size")]
    data = tiny_corpus(tmp_path / "c.txt")
    if name in PARALLEL:  # five words and the same reversed
        words = data.read_text().split()
        data.write_text("".join(f"{' '.join(words[i:i + 5])}\t{' '.join(words[i:i + 5][::-1])}\n"
                                for i in range(0, len(words) - 5, 5)))
    pretrain(name.split(":")[0], data=[str(data)], out=str(tmp_path / "run"), overrides=tiny + STEPS + extra)
    assert micro[0] >= 2
    assert not log, _report(log, micro)
    assert STATE["jagged"] or name not in UNPADDED  # the unpadded path ran, and was counted


FINETUNE = [("bert", "classification"), ("bert", "regression"), ("bert", "tagging+crf"), ("bert", "multiple_choice"),
            ("bert", "span_qa"), ("gpt", "classification"), ("xlnet", "span_qa"), ("lstm", "tagging"),
            ("transformer_xl", "classification"), ("transformer", "tagging"), ("seq2seq", "classification"),
            ("word2vec", "classification"), ("elmo", "classification"), ("elmo", "span_qa"),
            ("gpt", "multiple_choice"), ("seq2seq_gru", "tagging")]


@pytest.mark.parametrize("name,kind", FINETUNE)
def test_finetune_step_reads_nothing_from_the_host(name, kind, counted, tokenizer, tmp_path):
    from helpers import finetune

    log, micro = counted
    task, _ = ALL_TASKS[kind.split("+")[0]]
    run = tiny_run(tmp_path / name, name, tokenizer)
    data_dir, options = write_data(tmp_path / "data", kind)
    finetune(task, from_run=str(run), data_dir=data_dir, options=options, train__max_steps=2, train__batch_size=8,
             optim__lr=1e-2, task__max_seq_len=32, out=str(tmp_path / "ft"))
    assert micro[0] >= 2
    assert not log, _report(log, micro)
    # the unpadded path ran, and was counted (SST-2's sample batches rows of one length: nothing to unpad)
    assert STATE["jagged"] or name != "bert" or kind == "classification"


def _step_and_grads(objective, model, batch):
    model.zero_grad(set_to_none=True)
    out = objective.step(model, batch)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("recipe,family", [("bert-mini", "bert"), ("spanbert-mini", "spanbert"), ("gpt-mini", "gpt"),
                                           ("txl-mini", "transformer_xl")])
def test_the_device_generic_path_computes_what_the_cpu_path_does(recipe, family, monkeypatch):
    """Same loss and gradients, up to rounding, with the CPU's own kernels and on the path a GPU takes (unpadded
    encoder rows, SpanBERT's fixed-shape boundary targets, the fused LM loss without its CPU fix-ups, adaptive
    clusters counted on the host), from the same weights and batch."""
    from plmcli.config import load_recipe
    from plmcli.models import lm_loss
    from plmcli.models.registry import build_model
    from plmcli.objectives.registry import objective_class

    adaptive = ["model.cutoffs=[20,35]", "model.div_val=2"] if family == "transformer_xl" else []
    r = load_recipe(recipe, tiny_overrides(family) + adaptive + ["model.dropout=0", "model.attn_dropout=0", "train.seq_len=16"])
    torch.manual_seed(0)
    model = build_model(r.family, r.model).train()
    objective = objective_class(r.objective_name)(r.objective, None, {"pad": 0, "cls": 1, "sep": 2, "mask": 3}, 16)
    ids = torch.randint(4, 50, (3, 16))
    if family == "gpt":  # the fused head-and-loss in chunks: on a CPU (V, n), every row scored; else (n, V), masked
        monkeypatch.setattr(lm_loss, "chunk_rows", lambda vocab_size, device: 16)
        batch = {"input_ids": ids, "labels": ids.roll(-1, 1)}
    elif family == "transformer_xl":
        batch = {"input_ids": ids, "labels": ids.roll(-1, 1).contiguous(), "reset": True,
                 "tokens": torch.cat([ids, ids[:, :1]], 1).tolist()}
    else:  # rows of 16, 11 and 7 tokens; masked runs of 1-3 tokens
        lengths = [16, 11, 7]
        positions = torch.tensor([2, 3, 4, 9, 17, 18, 25, 33, 36, 37])
        batch = {"input_ids": ids, "attention_mask": (torch.arange(16) < torch.tensor(lengths)[:, None]).long(),
                 "lengths": lengths, "mlm_positions": positions, "mlm_labels": ids.flatten()[positions]}
        if family == "bert":
            batch |= {"token_type_ids": (torch.arange(16) >= 5).long().expand(3, 16).contiguous(),
                      "nsp_labels": torch.tensor([0, 1, 0])}
    cpu_loss, cpu_grads = _step_and_grads(objective, model, batch)
    with kernels.switched(False):
        loss, grads = _step_and_grads(objective, model, batch)
    torch.testing.assert_close(loss, cpu_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == cpu_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, cpu_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def _counts_outside(micro_batches, paused):
    """micro_batches with the objective's `loss_counts` (host batch in, CPU tensors out) run outside the count."""
    def wrapped(self):
        objective = self.objective
        if not getattr(objective, "_counted_outside", False):
            objective.loss_counts = paused(objective.loss_counts)
            objective._counted_outside = True
        return micro_batches(self)
    return wrapped


@pytest.mark.parametrize("name", ["gpt-mini", "roberta-mini", "bert-base-lamb"])
def test_the_whole_optimizer_step_reads_nothing_but_on_its_last_step(name, counted, tmp_path, monkeypatch):
    """THE loop's optimizer step as a whole (micro-batches, the loss shares, clipping, the non-finite skip decided
    on the device, the optimizer — fused AdamW, and LAMB —, the schedule, the step's health counters): no host read
    on any step but the run's last, which reads its counts exactly. The batches come from the loader (built as a
    worker would) and the health counters' copies arrive in pinned host memory on a GPU, read once an event says
    they landed: neither is counted."""
    from plmcli.api import pretrain
    from plmcli.train import health, loop

    log, micro = counted
    per_step: list = []
    real_step, real_arrived = loop._Training.optimizer_step, health.StepHealth.arrived

    def paused(fn):
        def call(*a, **k):
            STATE["paused"] += 1
            try:
                return fn(*a, **k)
            finally:
                STATE["paused"] -= 1
        return call

    class Fetched:  # the training batches, fetched outside the count
        def __init__(self, it):
            self.it = it

        def __next__(self):
            return paused(next)(self.it)

    def optimizer_step(self):
        if not isinstance(self.batches, Fetched):
            self.batches = Fetched(self.batches)
        before = len(log)
        with HostReads(log):
            out = real_step(self)
        per_step.append(log[before:])
        return out

    monkeypatch.setattr(loop._Training, "optimizer_step", optimizer_step)
    monkeypatch.setattr(health.StepHealth, "arrived", paused(real_arrived))
    # The targets per loss part come from the batch as the loader gave it, in host memory, before it moves:
    # CPU tensors made there wait for no device.
    monkeypatch.setattr(loop._Training, "micro_batches", _counts_outside(loop._Training.micro_batches, paused))
    family = "bert" if name != "gpt-mini" else "gpt"
    tiny = [o for o in tiny_overrides(family) if not o.startswith("model.vocab_size")]
    extra = ["model.max_positions=18"] if name == "roberta-mini" else []
    steps = [o for o in STEPS if not o.startswith("train.max_steps")] + ["train.max_steps=4", "train.micro_batch_size=2"]
    pretrain(name, data=[str(tiny_corpus(tmp_path / "c.txt"))], out=str(tmp_path / "run"), overrides=tiny + steps + extra)
    phases = 2 if name == "bert-base-lamb" else 1  # seq 128, then 512: each phase's last step reads its counts
    assert len(per_step) == 4 * phases and micro[0] == 8 * phases
    quiet = [reads for k, reads in enumerate(per_step) if k % 4 != 3]
    assert not any(quiet), _report([r for s in quiet for r in s], micro)
