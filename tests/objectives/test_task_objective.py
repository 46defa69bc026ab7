"""objectives/task.py, the evaluation every finetuning objective shares: a dev split scored by two processes gives
what one process gives (each example once, a process with no examples joining the gather), and prediction leaves
the model in the mode it found it in."""

from contextlib import nullcontext

import pytest
import torch

from plmcli.data.tasks.registry import get_task
from plmcli.objectives.choice import Choice, ChoiceConfig
from test_choice import RowScore, swag_files, tokenizer  # noqa: F401  (tokenizer: the module's fixture)

CPU = torch.device("cpu")


class OneProcess:
    num_processes = 1
    device = CPU
    autocast = staticmethod(nullcontext)


class TwoProcesses(OneProcess):
    """Rank `rank`'s accelerator in a run of two: the other rank's outputs (`theirs`, its `collect`) join each
    gather in turn, padded to the longer of the two, as accelerate's pad_across_processes and gather do."""

    num_processes = 2

    def __init__(self, rank: int, theirs: dict):
        self.rank, self.theirs, self.padded = rank, iter(theirs.items()), None

    def pad_across_processes(self, v, dim=0, pad_index=0):
        name, other = next(self.theirs)
        assert other.dtype == v.dtype and other.shape[1:] == v.shape[1:], f"{name}: the ranks gather different tensors"
        n = max(len(v), len(other))

        def pad(t):
            return torch.cat([t, t.new_full((n - len(t), *t.shape[1:]), pad_index)])

        self.padded = pad(other)
        return pad(v)

    def gather(self, v):
        return torch.cat([v, self.padded] if self.rank == 0 else [self.padded, v])


@pytest.mark.parametrize("n_dev", [5, 1])  # 5: rank 0 reads examples 0, 1 and 4, rank 1 2 and 3; 1: rank 1 reads none
def test_two_processes_score_the_dev_split_as_one(tmp_path, tokenizer, n_dev):  # noqa: F811
    tok, meta = tokenizer
    task = get_task("swag", swag_files(tmp_path / "swag", 4, n_dev, 0))
    obj = Choice(ChoiceConfig(num_labels=4), tok, meta["special_token_ids"], 64, task=task)
    data = tmp_path / "data"
    obj.encode_splits(task.load(None), data)
    model = RowScore()
    one = obj.evaluate(OneProcess(), model, obj.stream(data, "validation", 2, 0, 0, 1, shuffle=False), 0)
    assert set(one) == {"val_loss", "val_accuracy"}
    streams = [obj.stream(data, "validation", 2, 0, rank, 2, shuffle=False) for rank in range(2)]
    outputs = [obj.collect(model, s, 0, CPU, nullcontext, with_loss=True) for s in streams]
    assert [len(o["index"]) for o in outputs] == ([3, 2] if n_dev == 5 else [1, 0])
    assert list(outputs[1]) == list(outputs[0])  # an empty rank's names in the same order: the gathers pair up
    for rank in range(2):
        assert obj.evaluate(TwoProcesses(rank, outputs[1 - rank]), model, streams[rank], 0) == pytest.approx(one)


def test_predict_restores_the_mode_and_reads_the_split_in_order(tmp_path, tokenizer):  # noqa: F811
    tok, meta = tokenizer
    task = get_task("swag", swag_files(tmp_path / "swag", 4, 5, 3))
    obj = Choice(ChoiceConfig(num_labels=4), tok, meta["special_token_ids"], 64, task=task)
    data = tmp_path / "data"
    counts = {k: v["documents"] for k, v in obj.encode_splits(task.load(None), data)["counts"].items()}
    model = RowScore().train()
    ids, preds = obj.predict_split(model, data, "validation", 2, 0)
    assert model.training and list(ids) == [str(1000 + i) for i in range(5)] and len(preds) == 5
    model.eval()
    assert obj.write_test_predictions(model, data, counts, tmp_path, 2, 0) == {"test": "SWAG.tsv"} and not model.training
    rows = (tmp_path / "SWAG.tsv").read_text().splitlines()
    assert [r.split("\t")[0] for r in rows[1:]] == [str(2000 + i) for i in range(3)]
