"""XLNet: parity with transformers' XLNetLMHeadModel (two segments with memory, both streams, relative
segments, bi_data), the encoder interface finetune uses, memory, and left-to-right scoring."""

import pytest
import torch
from transformers import XLNetConfig as HFConfig
from transformers import XLNetForSequenceClassification, XLNetLMHeadModel

from plmcli.eval.scoring import score
from plmcli.models.xlnet import XLNet, XLNetConfig, rel_shift

V, C, L, H, F = 61, 32, 2, 4, 64


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw):
    base = dict(vocab_size=V, n_layer=L, n_head=H, d_model=C, d_ff=F, dropout=0.0, attn_dropout=0.0, mem_len=6)
    return XLNetConfig(**(base | kw))


def hf_pair(cls=XLNetLMHeadModel, **kw):
    """A transformers model from a tiny config (no download) and ours with its weights."""
    torch.manual_seed(0)
    hf = cls(HFConfig(vocab_size=V, d_model=C, n_layer=L, n_head=H, d_inner=F, dropout=0.0, **kw)).eval()
    ours = XLNet(tiny(mem_len=kw.get("mem_len", 6))).eval()
    missing, unexpected = ours.load_state_dict(XLNet.from_hf(hf.config.to_dict(), hf.state_dict())[1], strict=False)
    # an LM-head model has no sequence summary, a classifier no LM bias
    assert not unexpected and set(missing) == ({"lm_bias"} if hasattr(hf, "sequence_summary") else {"summary.weight", "summary.bias"})
    return hf, ours


def pretraining_batch(B=4, T=8, M=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (B, T), generator=g)
    types = torch.randint(0, 3, (B, T), generator=g)
    perm = (torch.rand(B, T, T, generator=g) > 0.5).float()
    mapping = torch.zeros(B, M, T)
    for b in range(B):
        pos = torch.randperm(T, generator=g)[:M]
        mapping[b, torch.arange(M), pos] = 1.0
        perm[b, pos, pos] = 1.0  # a target never sees itself
    return x, types, perm, mapping


@pytest.mark.parametrize("bi_data", [False, True])
def test_parity_with_transformers_over_two_segments_with_memory(bi_data):
    hf, ours = hf_pair(mem_len=6, reuse_len=5, bi_data=bi_data)
    hf_mems = mems = None
    for seg in range(2):  # the second segment attends to the first one's memory
        x, types, perm, mapping = pretraining_batch(seed=seg)
        with torch.no_grad():
            ref = hf(x, token_type_ids=types, perm_mask=perm, target_mapping=mapping, mems=hf_mems, use_mems=True)
            logits, mems = ours(x, types, perm, mapping, mems, reuse_len=5, bi_data=bi_data)
        assert logits.shape == (4, 3, V) and mems[0].shape == (4, 5 if seg == 0 else 6, C)
        torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)
        for ours_m, ref_m in zip(mems, ref.mems):
            torch.testing.assert_close(ours_m, ref_m.transpose(0, 1), atol=1e-5, rtol=1e-5)
        hf_mems = ref.mems


def test_content_stream_is_xlnet_models_output():
    hf, ours = hf_pair()
    x, types, perm, _ = pretraining_batch()
    pad = torch.ones(4, 8)
    pad[1, 6:] = 0
    with torch.no_grad():
        ref = hf.transformer(x, token_type_ids=types, perm_mask=perm, attention_mask=pad).last_hidden_state
        h, g, _ = ours.stack(x, types, perm, key_pad=pad == 0, mem_len=0)
        plain = ours(x)[0]
    assert g is None
    torch.testing.assert_close(h, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain, hf(x).logits, atol=1e-5, rtol=1e-5)  # no perm mask: all see all


def test_encode_is_xlnets_classifier_summary():
    """encode = content stream with <cls> (the last token) in segment 2, pooled by the sequence summary."""
    hf, ours = hf_pair(XLNetForSequenceClassification, num_labels=2)  # its summary loaded too
    x, types, _, _ = pretraining_batch()
    hf_types = types.clone()
    hf_types[:, -1] = 2
    with torch.no_grad():
        hidden = hf.transformer(x, token_type_ids=hf_types).last_hidden_state
        h, pooled = ours.encode(x, types)  # whatever type the last token had, it is <cls>'s own segment
    torch.testing.assert_close(h, hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled, hf.sequence_summary(hidden), atol=1e-5, rtol=1e-5)


def test_encode_right_padding_changes_nothing_real():
    torch.manual_seed(0)
    m = XLNet(tiny()).eval()
    x = torch.randint(0, V, (1, 7))
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        h, pooled = m.encode(x, types)
        for filler in (0, 42):
            xp = torch.cat([x, torch.full((1, 4), filler)], 1)
            tp = torch.cat([types, torch.zeros(1, 4, dtype=torch.long)], 1)
            mp = torch.cat([torch.ones(1, 7), torch.zeros(1, 4)], 1).long()
            hp, pp = m.encode(xp, tp, mp)
            torch.testing.assert_close(hp[:, :7], h, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(pp, pooled, atol=1e-5, rtol=1e-5)


def test_weights_round_trip_to_transformers():
    hf, ours = hf_pair()
    torch.manual_seed(1)
    other = XLNet(tiny())
    missing, unexpected = hf.load_state_dict(other.to_hf({"tokenizer": {}})[1], strict=False)
    assert not unexpected and missing == ["lm_loss.weight"]  # tied: written once, as the word embedding
    back = XLNet.from_hf(hf.config.to_dict(), hf.state_dict())[1]
    assert set(back) == set(other.state_dict()) - {"summary.weight", "summary.bias"}  # an LM model has no summary
    for k, v in back.items():
        assert torch.equal(v, other.state_dict()[k]), k
    assert torch.equal(hf.lm_loss.weight, other.wte.weight)  # tied: the decoder is the word embedding


def test_rel_shift_picks_each_keys_distance():
    Q, K = 3, 5  # distances K … 1-Q, one column each
    dist = torch.arange(K, -Q, -1.0).expand(1, 1, Q, -1)  # score = the distance itself
    out = rel_shift(dist, K)[0, 0]
    expect = (torch.arange(Q)[:, None] + K - Q) - torch.arange(K)[None, :]  # query i at K-Q+i, key j
    assert torch.equal(out, expect.float())


def test_memory_is_detached_and_changes_predictions():
    torch.manual_seed(0)
    m = XLNet(tiny(mem_len=8))
    x1, t1, p1, tm1 = pretraining_batch(seed=1)
    x2, t2, p2, tm2 = pretraining_batch(seed=2)
    _, mems = m(x1, t1, p1, tm1)
    assert all(not mm.requires_grad and mm.grad_fn is None for mm in mems)  # gradients never flow into memory
    logits, _ = m(x2, t2, p2, tm2, mems)
    logits.sum().backward()
    assert m.wte.weight.grad is not None
    with torch.no_grad():
        alone = m(x2, t2, p2, tm2)[0]
        other = m(x2, t2, p2, tm2, [mm.flip(0) for mm in mems])[0]  # another history
    assert not torch.allclose(alone, logits) and not torch.allclose(other, logits)


def test_left_to_right_logits_are_causal_and_memory_reproduces_the_full_context():
    torch.manual_seed(0)
    m = XLNet(tiny(mem_len=20)).eval()
    x = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        full, _ = m.next_token_logits(x)
        y = x.clone()
        y[:, 7] = (y[:, 7] + 1) % V
        changed, _ = m.next_token_logits(y)
        # position t predicts token t+1 from tokens ≤ t: a change at 7 moves predictions from 7 on only
        torch.testing.assert_close(changed[:, :7], full[:, :7])
        assert not torch.allclose(changed[:, 7], full[:, 7])
        # the same text in segments of 5 with memory: identical scores (nothing was cut off)
        parts, mems = [], None
        for i in range(0, 12, 5):
            logits, mems = m.next_token_logits(x[:, i : i + 5], mems, mem_len=20)
            parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_left_to_right_is_the_identity_permutation():
    """next_token_logits = the pretraining forward with a causal perm mask and targets 1 … T-1."""
    torch.manual_seed(0)
    m = XLNet(tiny()).eval()
    x = torch.randint(0, V, (2, 9))
    perm = torch.ones(9, 9).triu().expand(2, -1, -1)  # i may not see j ≥ i
    mapping = torch.eye(9)[1:].expand(2, -1, -1)  # predict positions 1 … 8
    with torch.no_grad():
        ref, _ = m(x, torch.zeros_like(x), perm, mapping, mem_len=0)
        got, _ = m.next_token_logits(x[:, :8])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_eval_ppl_windows_and_memory_agree(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = "the cat sat on a mat while dogs ran far away".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<eod>", "<unk>"] + words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    f = tmp_path / "t.txt"
    f.write_text(" ".join(words[i % 11] for i in range(37)) + "\n")
    cfg = {"tokenizer": {"special_token_ids": {"eos": 0, "unk": 1}}, "seq_len": 8}
    torch.manual_seed(0)
    m = XLNet(tiny(vocab_size=13, mem_len=4))
    whole = score(m, [str(f)], tok, cfg, max_length=64)
    mem = score(m, [str(f)], tok, cfg, mem_len=64, tgt_len=8)
    assert whole["tokens"] == mem["tokens"] == 37  # every token once, the first conditioned on <eod>
    assert whole["ppl"] == pytest.approx(mem["ppl"], rel=1e-5)
    short = score(m, [str(f)], tok, cfg, tgt_len=4)  # the config's memory (4 states): less context
    assert short["mem_len"] == 4 and short["tokens"] == 37 and short["ppl"] != pytest.approx(whole["ppl"], rel=1e-5)
    assert "identity permutation" in whole["factorisation"] and mem["context"].startswith("segments of 8")


def test_flops_and_positions():
    m = XLNet(tiny(max_positions=64))
    assert m.max_positions == 64 and m.flops_per_token(16) > 6 * sum(p.numel() for p in m.blocks.parameters())
