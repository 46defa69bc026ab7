import json
from plmcli.config import override_layers
import math
from pathlib import Path

import pytest
import torch

from helpers import tiny_corpus
from plmcli.config import load_recipe
from plmcli.models.bert import Bert, BertConfig
from plmcli.models.nezha import Nezha, NezhaConfig

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "glue-sample"


def tiny(**kw):
    base = dict(vocab_size=97, max_positions=32, max_relative_position=3, n_layer=2, n_head=2, d_model=16, d_ff=24,
                dropout=0.0, attn_dropout=0.0)
    return NezhaConfig(**(base | kw))


def _randomize(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


# ---------------------------------------------------------------- the paper's formulas, one (i, j) at a time


def _a(i: int, j: int, K: int, d: int) -> list[float]:
    """a_ij, eqs. 6-7, at NEZHA's code's argument clip(j − i, ±K) + K (see plmcli/models/nezha.py)."""
    r = max(-K, min(K, j - i)) + K
    out = []
    for k in range(d // 2):
        w = r / 10000 ** (2 * k / d)
        out += [math.sin(w), math.cos(w)]
    return out


def _naive_attention(attn, x, keep, K):
    """Eqs. 2, 4, 5 with explicit loops: e_ij = q_i·(k_j + a_ij)/√d, z_i = Σ_j α_ij (v_j + a_ij)."""
    B, T, C = x.shape
    H = attn.n_head
    d = C // H
    q, k, v = attn.qkv(x).split(C, dim=-1)
    z = torch.zeros(B, T, C)
    for b in range(B):
        for h in range(H):
            s = slice(h * d, (h + 1) * d)
            for i in range(T):
                e = torch.full((T,), float("-inf"))
                for j in range(T):
                    if keep[b, j]:
                        e[j] = q[b, i, s] @ (k[b, j, s] + torch.tensor(_a(i, j, K, d))) / math.sqrt(d)
                alpha = torch.softmax(e, 0)
                for j in range(T):
                    if keep[b, j]:
                        z[b, i, s] += alpha[j] * (v[b, j, s] + torch.tensor(_a(i, j, K, d)))
    return attn.proj(z)


def _naive_encode(m: Nezha, x, types, keep):
    h = m.ln_emb(m.wte(x) + m.wtt(types))
    for blk in m.blocks:
        h = blk.ln_1(h + _naive_attention(blk.attn, h, keep, m.cfg.max_relative_position))
        h = blk.ln_2(h + blk.mlp(h))
    return h


def test_matches_a_loop_over_the_papers_formulas():
    """T = 9 > K = 3, so distances are clipped; one sequence is padded."""
    torch.manual_seed(0)
    m = Nezha(tiny()).eval()
    _randomize(m)
    x = torch.randint(5, 97, (2, 9))
    types = torch.tensor([[0] * 5 + [1] * 4, [0] * 3 + [1] * 3 + [0] * 3])
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    with torch.no_grad():
        out = m(x, types, mask)
        ref = _naive_encode(m, x, types, mask.bool())
        torch.testing.assert_close(out.hidden, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.mlm_logits, m.mlm(ref), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.nsp_logits, m.nsp(torch.tanh(m.pooler(ref[:, 0]))), atol=1e-5, rtol=1e-5)


def test_relative_table_is_nezhas_sinusoid_of_the_clipped_distance():
    m = Nezha(tiny(max_relative_position=4, d_model=16, n_head=2))  # d_head 8
    table, index = m.relative(12, "cpu")
    assert table.shape == (9, 8) and index.shape == (12, 12)
    for i, j in [(0, 0), (0, 3), (5, 1), (0, 11), (11, 0), (6, 9)]:
        torch.testing.assert_close(table[index[i, j]], torch.tensor(_a(i, j, 4, 8)), atol=1e-6, rtol=0)
    short_table, short_index = m.relative(3, "cpu")  # only distances -2..2 occur: 5 rows
    assert short_table.shape == (5, 8)
    torch.testing.assert_close(short_table[short_index], table[index][:3, :3])


# ---------------------------------------------------------------- no absolute positions


def test_no_parameter_depends_on_the_maximum_length():
    short, long = Nezha(tiny(max_positions=16)), Nezha(tiny(max_positions=4096))
    shapes = lambda m: {n: tuple(p.shape) for n, p in m.state_dict().items()}  # noqa: E731
    assert shapes(short) == shapes(long)
    assert all(4096 not in s for s in shapes(long).values()) and "rel_table" not in shapes(long)
    assert not any("position" in n or "wpe" in n for n in shapes(long))
    assert long.max_positions == 4096 and short.max_positions == 16
    with pytest.raises(ValueError, match="max_positions=16"):
        short(torch.zeros(1, 17, dtype=torch.long))
    # The same weights read longer sequences once the cap is raised.
    torch.manual_seed(0)
    long.load_state_dict(short.state_dict())
    assert torch.isfinite(long.eval()(torch.randint(5, 97, (1, 40))).mlm_logits).all()


def test_a_sequence_reads_the_same_wherever_it_starts():
    """The same tokens after s masked-out padding tokens (left padding): with relative positions only,
    their hidden states are those of the sequence alone. BERT, with absolute positions, changes."""
    torch.manual_seed(0)
    m = Nezha(tiny(max_relative_position=4)).eval()
    _randomize(m)
    bert = Bert(BertConfig(vocab_size=97, max_positions=32, n_layer=2, n_head=2, d_model=16, d_ff=24,
                           dropout=0.0, attn_dropout=0.0)).eval()
    x = torch.randint(5, 97, (1, 10))
    types = torch.tensor([[0] * 4 + [1] * 6])
    with torch.no_grad():
        alone, bert_alone = m(x, types).hidden, bert(x, types).hidden
        for s, filler in [(1, 0), (3, 42), (11, 7)]:
            xs = torch.cat([torch.full((1, s), filler), x], 1)
            ts = torch.cat([torch.zeros(1, s, dtype=torch.long), types], 1)
            ms = torch.cat([torch.zeros(1, s), torch.ones(1, 10)], 1)
            torch.testing.assert_close(m(xs, ts, ms).hidden[:, s:], alone, atol=1e-5, rtol=1e-5)
            assert not torch.allclose(bert(xs, ts, ms).hidden[:, s:], bert_alone, atol=1e-3)
        # and inside a batch: the sequence at offset 3 of a longer row, next to another sequence
        batch = torch.stack([torch.cat([torch.full((3,), 0), x[0], torch.full((2,), 0)]), torch.randint(5, 97, (15,))])
        tb = torch.stack([torch.cat([torch.zeros(3, dtype=torch.long), types[0], torch.zeros(2, dtype=torch.long)]),
                          torch.zeros(15, dtype=torch.long)])
        mb = torch.tensor([[0] * 3 + [1] * 10 + [0] * 2, [1] * 15])
        torch.testing.assert_close(m(batch, tb, mb).hidden[0:1, 3:13], alone, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- size and cost


def test_nezha_base_is_bert_base_without_its_position_table():
    transformers = pytest.importorskip("transformers")
    from plmcli.api import count_params

    cfg = transformers.BertConfig(vocab_size=21128, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                  intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)
    with torch.device("meta"):
        bert = sum(p.numel() for p in transformers.BertForPreTraining(cfg).parameters())
    assert count_params(load_recipe("nezha-base")) == bert - 512 * 768


def test_flops_add_the_relative_terms():
    m = Nezha(tiny(vocab_size=1000, max_relative_position=3))
    body = sum(p.numel() for p in m.blocks.parameters())
    bert_like = 6 * (body + 0.15 * (16 * 16 + 16 * 1000)) + 12 * 2 * 64 * 16
    assert m.flops_per_token(64) == pytest.approx(bert_like + 12 * 2 * 16 * 7)  # R = 2K + 1 = 7 rows
    assert m.flops_per_token(2) == pytest.approx(6 * (body + 0.15 * (16 * 16 + 16 * 1000)) + 12 * 2 * 16 * (2 + 3))


def test_interface_and_tied_decoder():
    m = Nezha(tiny())
    assert m.traits.bidirectional and not m.traits.causal and m.mlm.decoder.weight is m.wte.weight
    h, pooled = m.encode(torch.randint(0, 97, (2, 5)))
    assert h.shape == (2, 5, 16) and pooled.shape == (2, 16)
    with pytest.raises(ValueError, match="even head size"):
        Nezha(tiny(d_model=18, n_head=2))


# ---------------------------------------------------------------- end to end


def test_nezha_mini_pretrains_then_finetunes_sst2(tmp_path):
    from plmcli import api
    from helpers import finetune
    from plmcli.runs import load_finetuned

    r = load_recipe("nezha-mini")
    assert (r.family, r.objective.masking, r.objective.pairs) == ("nezha", "wwm", "nsp")
    over = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.d_ff=64", "model.max_positions=32",
            "model.max_relative_position=8", "tokenizer.vocab_size=120", "data.val_fraction=0.2",
            "objective.dupe_factor=1", "train.seq_len=32", "train.global_batch_size=8", "train.eval_every=3",
            "train.eval_batches=2", "train.save_every=0", "train.log_every=1"]
    s = api.pretrain("nezha-mini", [str(tiny_corpus(tmp_path / "c.txt", 40))], str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 4}))
    assert s["steps"] == 4 and math.isfinite(s["val_mlm_loss"]) and 0 <= s["val_nsp_acc"] <= 1
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["family"] == "nezha" and cfg["model"]["max_relative_position"] == 8
    res = finetune("sst2", from_run=str(tmp_path / "run"), data_dir=str(SAMPLE), train__max_steps=3, train__batch_size=8, out=str(tmp_path / "ft"))
    # max_seq_len defaults to min(128, max_positions): the configured cap, 32
    assert res["steps"] == 3 and res["settings"]["max_seq_len"] == 32 and 0 <= res["dev"]["accuracy"] <= 1
    model, _, _ = load_finetuned(str(tmp_path / "ft"))
    assert isinstance(model.encoder, Nezha)
