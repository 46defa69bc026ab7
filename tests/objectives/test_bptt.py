import math

from plmcli.config import override_layers
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_corpus
from plmcli import api
from plmcli.errors import PlmError
from plmcli.models.gpt import GPT, GPTConfig
from plmcli.models.rnn import RNNLM, RNNConfig
from plmcli.objectives.bptt import SegmentStream, TruncatedBPTT, detach_state


pytestmark = pytest.mark.usefixtures("one_thread")


N, B, T = 103, 2, 4  # 2 streams of L = 51 tokens; 103 - 102 = 1 token left over


def test_streams_are_contiguous_and_segments_consecutive():
    tokens = np.arange(N)
    s = SegmentStream(tokens, B, T)
    assert s.stream_len == 51 and s.batches_per_epoch() == 50 // 4 == 12
    first = s[0]
    assert first["reset"] and torch.equal(first["input_ids"], torch.tensor([[0, 1, 2, 3], [51, 52, 53, 54]]))
    assert torch.equal(first["labels"], first["input_ids"] + 1)
    for k in range(11):
        a, b = s[k]["input_ids"], s[k + 1]["input_ids"]
        assert torch.equal(b[:, 0], a[:, -1] + 1)  # segment k+1 continues segment k, row by row
        assert not s[k + 1]["reset"]
    # an epoch wraps around: segment 12 is segment 0 again, and restarts the state
    assert torch.equal(s[12]["input_ids"], s[0]["input_ids"]) and s[12]["reset"]
    assert s[12 * 7 + 3]["input_ids"].tolist() == s[3]["input_ids"].tolist()


def test_ranks_take_their_own_slice_of_the_streams():
    tokens = np.arange(203)
    one = SegmentStream(tokens, 4, T)  # 4 streams of 50 on one process
    r0, r1 = (SegmentStream(tokens, 2, T, rank=r, world=2) for r in (0, 1))  # 2 × 2 on two processes
    for k in (0, 5, 30):
        assert torch.equal(torch.cat([r0[k]["input_ids"], r1[k]["input_ids"]]), one[k]["input_ids"])
    assert r1[0]["input_ids"][:, 0].tolist() == [100, 150]


def test_evaluation_reads_everything_once():
    s = SegmentStream(np.arange(N), B, T, train=False)
    assert s.batches_per_epoch() == 13  # 12 full segments and one of 50 - 48 = 2 tokens
    last = s[12]
    assert last["input_ids"].tolist() == [[48, 49], [99, 100]] and last["labels"].tolist() == [[49, 50], [100, 101]]
    assert s[13] is None and s[40] is None
    seen = torch.cat([s[k]["labels"] for k in range(13)], 1)
    assert seen.tolist() == [list(range(1, 51)), list(range(52, 102))]  # all but each stream's first token


def test_too_little_text_is_a_clear_error():
    with pytest.raises(PlmError, match="too few for 4 streams of 20\\+1"):
        SegmentStream(np.arange(50), 4, 20)
    with pytest.raises(PlmError, match="validation split"):
        SegmentStream(np.arange(7), 4, 20, train=False, split="validation")
    SegmentStream(np.arange(8), 4, 20, train=False)  # 2 tokens per stream: one prediction each


def _objective():
    return TruncatedBPTT(TruncatedBPTT.Config(), None, {"eos": 0}, T)


def _model(cell="lstm"):
    torch.manual_seed(0)
    return RNNLM(RNNConfig(vocab_size=31, cell=cell, n_layer=2, d_embed=8, d_hidden=8))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_state_is_carried_and_detached(cell):
    obj, model = _objective(), _model(cell)
    s = SegmentStream(np.random.default_rng(0).integers(0, 31, 60), 2, 5)
    out0 = obj.step(model, s[0], None)
    out1 = obj.step(model, s[1], out0.state)
    # carried: segment 1 with the state equals the second half of one pass over both segments
    logits, _ = model(torch.cat([s[0]["input_ids"], s[1]["input_ids"]], 1))
    full = F.cross_entropy(logits[:, 5:].flatten(0, 1), s[1]["labels"].flatten())
    torch.testing.assert_close(out1.loss, full)
    assert out1.count == 10 and out1.metrics["loss"] == pytest.approx(out1.loss.item() * 10)
    # detached: the gradient of segment 1's loss stops at the boundary
    leaf = tuple(x.detach().clone().requires_grad_(True) for x in detach_state((out0.state,) if cell == "gru" else out0.state))
    out = obj.step(model, s[1], leaf[0] if cell == "gru" else leaf)
    out.loss.backward()
    assert all(x.grad is None for x in leaf)
    assert model.wte.weight.grad is not None
    # a reset batch (first segment of an epoch) ignores the incoming state
    torch.testing.assert_close(obj.step(model, s[0], out1.state).loss, out0.loss)


def test_only_stateful_models():
    obj = _objective()
    obj.check_model(_model())
    with pytest.raises(PlmError, match="recurrent state"):
        obj.check_model(GPT(GPTConfig(vocab_size=10, n_layer=1, n_head=1, d_model=8, max_positions=8)))


def test_trains_resumes_and_evaluates_through_the_loop(tmp_path):
    corpus = tiny_corpus(tmp_path / "corpus.txt")
    over = ["train.global_batch_size=4", "train.seq_len=10",  # the recipe's 2×200 LSTM and SGD
            "data.val_fraction=0.2", "train.eval_every=0", "train.save_every=6", "train.log_every=5",
            "optim.decay_start=10000"]
    s = api.pretrain("lstm-ptb-small", [str(corpus)], str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 45}))
    assert s["val_loss"] < 2.5 < math.log(18)  # well below uniform over the 16 words, eos and unk
    half = api.pretrain("lstm-ptb-small", [str(corpus)], str(tmp_path / "half"), stop_after=6, overrides=override_layers(over, {"train.max_steps": 12}))
    assert half["steps"] == 6
    done = api.pretrain(out=str(tmp_path / "half"), resume=True)  # data from segment 6 on, state from zeros
    assert done["steps"] == 12 and math.isfinite(done["val_loss"])
