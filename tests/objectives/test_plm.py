"""The permutation-LM objective (XLNet): data layout, span targets, factorisation order, memory, and
xlnet-mini end to end (pretrain -> finetune SST-2 -> eval-ppl)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import finetune, tiny_corpus
from plmcli import api
from plmcli.config_sections import TokenizerConfig
from plmcli.data.corpus import token_stream, tokenize_corpus
from plmcli.errors import PlmError
from plmcli.models.xlnet import XLNet, XLNetConfig
from plmcli.objectives.plm import PermutationLM, PLMConfig, permutation_mask, sample_targets, split_a_b, _Row

SPECIALS = {"pad": "<pad>", "unk": "<unk>", "cls": "<cls>", "sep": "<sep>", "mask": "<mask>", "eos": "<eod>"}
T, R, NP = 16, 8, 4  # seq_len, reuse_len, num_predict
GLUE = Path(__file__).resolve().parents[2] / "data" / "glue-sample"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("plm")
    tiny_corpus(d / "c.txt", n_docs=40)
    cfg = TokenizerConfig(kind="word", vocab_size=200, min_frequency=1, special_tokens=SPECIALS)
    tokenize_corpus([str(d / "c.txt")], d / "corpus", cfg, val_fraction=0.1)
    meta = json.loads((d / "corpus" / "meta.json").read_text())
    return d / "corpus", meta["tokenizer"]["special_token_ids"]


def objective(ids, **kw):
    return PermutationLM(PLMConfig(**{"num_predict": NP, "reuse_len": R, **kw}), None, ids, T)


def test_layout_reuse_part_continues_the_stream(corpus):
    path, ids = corpus
    obj = objective(ids)
    s = obj.stream(path, "train", 3, seed=0, rank=0, world=1, shuffle=True)
    tokens = np.asarray(token_stream(path, "train", ids["eos"]))
    L = len(tokens) // 3
    assert s.num_segments == (L - T) // R + 1 and s[0]["reset"] and not s[1]["reset"]
    for k in (0, 1, 5):
        b = s[k]
        x, seg = b["input_ids"], b["token_type_ids"]
        assert x.shape == (3, T) and b["perm_mask"].shape == (3, T, T) and b["target_mapping"].shape == (3, NP, T)
        for r in range(3):  # the reuse part is stream r at k·reuse_len: the memory is its true history
            assert x[r, :R].tolist() == tokens[r * L + k * R : r * L + (k + 1) * R].tolist()
            seps = (x[r] == ids["sep"]).nonzero().flatten().tolist()
            assert len(seps) == 2 and seps[1] == T - 2 and x[r, -1] == ids["cls"]
            # segments: reuse + A + <sep> 0, B + <sep> 1, <cls> 2
            assert seg[r].tolist() == [0] * (seps[0] + 1) + [1] * (T - 2 - seps[0]) + [2]
            a = x[r, R : seps[0]].tolist()
            assert a == tokens[r * L + (k + 1) * R : r * L + (k + 1) * R + len(a)].tolist()  # A continues it
    assert s[s.num_segments]["reset"] and torch.equal(s[s.num_segments]["input_ids"][:, :R], s[0]["input_ids"][:, :R])
    ev = obj.stream(path, "validation", 1, seed=0, rank=0, world=1, shuffle=False)
    assert ev[ev.batches_per_epoch() - 1] is not None and ev[ev.batches_per_epoch()] is None


def test_b_is_the_real_continuation_half_the_time():
    starts = np.zeros(400, bool)
    starts[::5] = True  # sentences of 5 tokens
    row = _Row(np.arange(400), np.ones(400, bool), starts, reverse=False)
    rng = np.random.default_rng(0)
    got = [split_a_b(row, 100, 12, rng) for _ in range(400)]
    assert 0.42 < np.mean([g[4] for g in got]) < 0.58
    for a0, a1, b0, b1, nxt in got:
        assert a0 == 100 and (a1 - a0) + (b1 - b0) == 12 and a1 > a0 and b1 > b0
        if nxt:  # B is the text after A's last sentence (A loses its end when the pair is too long)
            assert b0 % 5 == 0 and a1 <= b0 < 100 + 12
        else:
            assert b0 % 5 == 0  # a random B starts at a sentence


def test_span_targets_are_contiguous_spans_at_word_starts():
    rng = np.random.default_rng(1)
    words = rng.random(300) < 0.7
    words[0] = True
    for alpha in (6, 3):
        m = sample_targets(300, None, rng, alpha, 1, words)
        runs = np.split(np.flatnonzero(m), np.flatnonzero(np.diff(np.flatnonzero(m)) > 1) + 1)
        assert 1 <= max(len(r) for r in runs) <= 5 and all(words[r[0]] for r in runs)
        assert abs(m.mean() - 1 / (alpha + 1)) < 0.06  # n targets per n·(alpha/beta + 1) tokens
    allowed = np.ones(40, bool)
    allowed[[9, 25, 39]] = False
    for seed in range(20):  # a goal is met exactly, never on a disallowed token (<sep>, <cls>)
        m = sample_targets(40, 7, np.random.default_rng(seed), 6, 1, None, allowed)
        assert m.sum() == 7 and not (m & ~allowed).any()


def test_targets_exact_count_and_never_special(corpus):
    path, ids = corpus
    s = objective(ids).stream(path, "train", 4, seed=3, rank=0, world=1, shuffle=True)
    for k in range(6):
        b = s[k]
        tm, labels, x = b["target_mapping"], b["labels"], b["input_ids"]
        assert (labels != -100).sum(1).tolist() == [NP] * 4
        pos = tm.argmax(-1)
        assert torch.equal(tm.sum(-1), torch.ones(4, NP)) and (pos.diff(dim=1) > 0).all()
        assert torch.equal(labels, x.gather(1, pos))  # the target is the token itself
        assert not ((labels == ids["sep"]) | (labels == ids["cls"])).any()
        # the reuse part and the rest each get their share: ceil(4 · 8/16) = 2
        assert ((pos < R).sum(1) == 2).all()


def factorisation_order(perm: np.ndarray):
    """The order implied by perm_mask: positions by how much their content stream sees (the content
    stream sees itself too). Ties only within the block of a part's non-target tokens, which see each other."""
    seen = (~(perm & ~np.eye(len(perm), dtype=bool))).sum(1)
    return np.lexsort((np.arange(len(seen)), seen)), seen


def test_factorisation_order_is_a_total_order(corpus):
    path, ids = corpus
    b = objective(ids).stream(path, "train", 4, seed=5, rank=0, world=1, shuffle=True)[2]
    for r in range(4):
        perm, x = b["perm_mask"][r].numpy(), b["input_ids"][r].numpy()
        tgt = np.zeros(T, bool)
        tgt[b["target_mapping"][r].argmax(-1).numpy()] = True
        func = (x == ids["sep"]) | (x == ids["cls"])
        ordinary = ~tgt & ~func
        content = perm & ~np.eye(T, dtype=bool)  # the content stream also sees itself
        z, seen = factorisation_order(perm)
        ordered = z[~ordinary[z]]  # targets and <sep>/<cls>: distinct places in the order
        assert len(set(seen[ordered])) == len(ordered)
        for t, i in enumerate(z):
            if ordinary[i]:  # non-targets: every ordinary token of the part and everything before the part
                part = slice(0, R) if i < R else slice(R, T)
                assert set(np.flatnonzero(~perm[i])) == set(np.flatnonzero(ordinary[part]) + part.start) | (
                    set(range(R)) if i >= R else set())
                continue
            before = set(z[:t].tolist())
            assert set(np.flatnonzero(~content[i])) == before | {i}  # content stream of z_t: z_≤t
            if tgt[i]:  # query stream of a target z_t: exactly z_<t, never its own token
                assert set(np.flatnonzero(~perm[i])) == before
            else:  # <sep>/<cls> are inputs, never predicted: their query rows equal their content rows
                assert set(np.flatnonzero(~perm[i])) == before | {i}
        assert (~perm[:, ordinary[:R].nonzero()[0]]).all()  # reuse-part non-targets: visible to all
        assert perm[:R, R:].all()  # the reuse part (the next memory) sees nothing of the rest
        part1 = np.flatnonzero(ordinary[R:]) + R
        assert (~perm[R:][:, part1]).all()


def test_permutation_mask_small_case_by_hand():
    target = np.array([0, 1, 0, 1, 1, 0], bool)
    func = np.array([0, 0, 0, 0, 0, 1], bool)  # a <cls>: ordered, never predicted
    perm = permutation_mask(target, func, 0, np.random.default_rng(0))
    rank = np.random.default_rng(0).permutation(6)  # the order the mask drew
    for i in range(6):
        for j in range(6):
            if not (target[j] or func[j]):
                expect = True  # ordinary tokens come first: everyone sees them
            elif not (target[i] or func[i]):
                expect = False  # and they see no target (nothing to leak)
            else:  # a target sees what precedes it; <cls> (whose content is its input) also itself
                expect = rank[j] < rank[i] or (func[i] and i == j)
            assert (not perm[i, j]) == expect, (i, j)
    # perm_size 2 over 6 tokens: blocks [0, 2), [2, 4), [4, 6) in order
    all_t = np.ones(6, bool)
    p = permutation_mask(all_t, np.zeros(6, bool), 0, np.random.default_rng(0), perm_size=2)
    assert p[:2, 2:].all() and not p[2:4, :2].any() and not p[4:, :4].any()


def test_model_sees_exactly_what_the_mask_allows(corpus):
    """Change one input token at a time: a target's query-stream logits move iff the token is visible."""
    path, ids = corpus
    b = objective(ids).stream(path, "train", 1, seed=7, rank=0, world=1, shuffle=True)[1]
    torch.manual_seed(0)
    m = XLNet(XLNetConfig(vocab_size=60, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0, attn_dropout=0.0)).eval()
    args = (b["token_type_ids"], b["perm_mask"], b["target_mapping"])
    with torch.no_grad():
        base, _ = m(b["input_ids"], *args)
        pos = b["target_mapping"][0].argmax(-1)
        for j in range(T):
            x = b["input_ids"].clone()
            x[0, j] = (x[0, j] + 1) % 60
            moved = (m(x, *args)[0] - base).abs().amax(-1)[0] > 1e-6  # (num_predict,)
            assert moved.tolist() == (b["perm_mask"][0, pos, j] == 0).tolist(), j


def test_batches_are_a_pure_function_of_seed_step_and_row(corpus):
    path, ids = corpus
    one = objective(ids).stream(path, "train", 4, seed=11, rank=0, world=1, shuffle=True)
    again = objective(ids).stream(path, "train", 4, seed=11, rank=0, world=1, shuffle=True)
    halves = [objective(ids).stream(path, "train", 2, seed=11, rank=r, world=2, shuffle=True) for r in (0, 1)]
    for k in (3, 0, 9):  # any order: a resumed run reads batch k as the first run did
        a, b = one[k], again[k]
        assert all(torch.equal(a[key], b[key]) for key in a if key != "reset")
        for key in ("input_ids", "perm_mask", "labels"):  # two processes read the rows of one
            assert torch.equal(torch.cat([halves[0][k][key], halves[1][k][key]]), a[key])
    other = objective(ids).stream(path, "train", 4, seed=12, rank=0, world=1, shuffle=True)
    assert not torch.equal(other[3]["perm_mask"], one[3]["perm_mask"])


def test_bi_data_reads_half_the_rows_backwards(corpus):
    path, ids = corpus
    s = objective(ids, bi_data=True).stream(path, "train", 4, seed=0, rank=0, world=1, shuffle=True)
    tokens = np.asarray(token_stream(path, "train", ids["eos"]))
    L = len(tokens) // 2  # 2 streams, each read both ways
    x = s[1]["input_ids"]
    for r in range(2):
        fwd = tokens[r * L : (r + 1) * L]
        assert x[r, :R].tolist() == fwd[R : 2 * R].tolist()
        assert x[2 + r, :R].tolist() == fwd[::-1][R : 2 * R].tolist()
    with pytest.raises(PlmError, match="even micro batch"):
        objective(ids, bi_data=True).stream(path, "train", 3, seed=0, rank=0, world=1, shuffle=True)


def test_step_carries_detached_memory_and_resets(corpus):
    path, ids = corpus
    obj = objective(ids)
    s = obj.stream(path, "train", 2, seed=0, rank=0, world=1, shuffle=True)
    torch.manual_seed(0)
    m = XLNet(XLNetConfig(vocab_size=60, n_layer=2, n_head=2, d_model=16, d_ff=32, mem_len=12))
    out = obj.step(m, s[0], None)
    assert out.count == 2 * NP and math.isfinite(out.loss.item())
    assert len(out.state) == 2 and out.state[0].shape == (2, R, 16) and not out.state[0].requires_grad
    out.loss.backward()
    out2 = obj.step(m, s[1], out.state)
    assert out2.state[0].shape == (2, 12, 16)  # cat(8 old, 8 new)[-12:]
    assert torch.equal(out2.state[0][:, :4], out.state[0][:, 4:])
    out3 = obj.step(m, s[s.num_segments], out2.state)  # a new epoch: the memory starts empty again
    assert out3.state[0].shape == (2, R, 16)


def test_bad_settings_are_one_clear_error():
    with pytest.raises(PlmError, match="reuse_len 20 leaves no room"):
        PermutationLM(PLMConfig(reuse_len=20, num_predict=2), None, {}, 16)
    with pytest.raises(PlmError, match="num_predict 14 is more than a sequence of 16"):
        PermutationLM(PLMConfig(reuse_len=8, num_predict=14), None, {}, 16)
    with pytest.raises(PlmError, match="perm_size 3"):
        PermutationLM(PLMConfig(reuse_len=8, num_predict=2, perm_size=3), None, {}, 16)
    with pytest.raises(PlmError, match="two-stream"):
        from plmcli.models.gpt import GPT, GPTConfig

        objective({}).check_model(GPT(GPTConfig(vocab_size=10, n_layer=1, d_model=8, n_head=1, max_positions=16)))


def test_xlnet_mini_pretrains_finetunes_and_scores_text(tmp_path):
    tiny = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.mem_len=24",
            "tokenizer.vocab_size=300", "train.seq_len=32", "objective.reuse_len=16", "objective.num_predict=5",
            "train.global_batch_size=4", "train.max_steps=3", "train.eval_every=3", "train.eval_batches=1",
            "train.save_every=3", "train.log_every=1"]
    s = api.pretrain("xlnet-mini", out=str(tmp_path / "run"), overrides=tiny)
    assert s["stop_reason"] == "max_steps" and math.isfinite(s["val_loss"])
    res = finetune("sst2", from_run=str(tmp_path / "run"), data_dir=str(GLUE), train__max_steps=2,
                   train__batch_size=16, task__max_seq_len=32, out=str(tmp_path / "ft"))
    assert res["steps"] == 2 and 0 <= res["dev"]["accuracy"] <= 1
    data = np.load(tmp_path / "ft" / "data" / "train.npz")  # XLNet's layout: a <sep> <cls>
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())["tokenizer"]["special_token_ids"]
    first = data["ids"][: data["offsets"][1]]
    assert first[-1] == cfg["cls"] and first[-2] == cfg["sep"] and cfg["cls"] not in first[:-1]
    text = tmp_path / "eval.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n")
    r = api.eval_ppl([str(text)], str(tmp_path / "run"))
    assert math.isfinite(r["ppl"]) and r["ppl"] > 1 and r["tokens"] > 0
    assert r["factorisation"].startswith("left-to-right (identity permutation)")
