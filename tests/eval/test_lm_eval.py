"""plm runs under lm-evaluation-harness (plmcli.interop.lm_eval): tiny local tasks (JSON Lines data, no Hub) run
through `lm_eval.simple_evaluate`, and every request's answer checked against plm's own scorers: the eval-ppl
scorer of the family for whole texts, the model's logits by hand for continuations."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval")

from families import tiny_model  # noqa: E402
from helpers import assert_clean_error, run, tiny_gpt_run  # noqa: E402
from plmcli import api  # noqa: E402
from plmcli.errors import PlmError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CHOICE = [{"question": "a cat", "choices": [" sat", " ran", " mat"], "answer": 0},
          {"question": "dogs", "choices": [" ran", " sat"], "answer": 0}]
"""Short enough (with the start token, ≤ 16 characters: the tiny runs' window) for one forward pass by hand."""
TEXTS = [{"text": "the cat sat on a mat while dogs ran far away from home and back again"},
         {"text": "a mat while"}]
GEN = [{"question": "the cat sat on a", "answer": " mat"}, {"question": "dogs ran", "answer": " far"}]

TASK_YAML = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
{body}
"""
BODIES = {
    "plm_tiny_choice": ("multiple_choice", CHOICE, 'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
                        'doc_to_target: "{{answer}}"\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n'),
    "plm_tiny_rolling": ("loglikelihood_rolling", TEXTS, 'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
                         'metric_list:\n  - metric: word_perplexity\n'),
    "plm_tiny_gen": ("generate_until", GEN, 'doc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
                     'target_delimiter: ""\ngeneration_kwargs:\n  until: [".", "\\n"]\n  max_gen_toks: 4\n'
                     'metric_list:\n  - metric: exact_match\n'),
}


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, (output_type, rows, body) in BODIES.items():
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        (root / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=data, output_type=output_type, body=body),
                                           encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def manager(tasks_dir):
    """The harness' task index with the tiny tasks (building one reads every task YAML it ships: seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(tasks_dir))


@pytest.fixture
def one_index(manager, monkeypatch):
    """plm lm-eval builds its index from the shared one (what it is handed is checked: the tiny tasks' folder)."""
    import lm_eval.tasks

    def shared(include_path=None, **_):
        assert include_path == manager.include_path
        return manager

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", shared)


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    from helpers import dirs_under

    root = tmp_path_factory.mktemp("lm_eval_gpt")
    with dirs_under(root):
        return tiny_gpt_run(root)


@pytest.fixture(scope="module")
def gpt(gpt_run):
    return api.load_run(str(gpt_run))


def triple(family, gpt):
    """A tiny `family` model at the tiny GPT run's tokenizer (and its run config's special tokens, seq_len)."""
    _, tok, cfg = gpt
    model = tiny_model(family, [f"model.vocab_size={tok.get_vocab_size()}"])
    return model, tok, {**cfg, "family": family}


def evaluate(lm, manager, tasks):
    import lm_eval

    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, bootstrap_iters=0, log_samples=True)


def by_hand(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t+1] | ids[:t+1]) for every t, from one forward pass over the whole (short) sequence."""
    from plmcli.models.base import traits_of

    from plmcli.eval.memory import segment_lengths

    x = torch.tensor(ids)[None]
    with torch.no_grad():
        if traits_of(model).permutation_lm:
            logits = model.next_token_logits(x)[0]
        elif traits_of(model).has_memory:  # one segment, read with the evaluation settings
            with model.evaluation_memory(segment_lengths(model, {})[1]):
                logits = model(x)[0]
        elif traits_of(model).stateful:
            logits = model(x)[0]
        else:
            logits = model(x)
    lp = torch.log_softmax(logits[0].float(), -1)
    return lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].double(), logits[0, :-1].argmax(-1)


def eval_ppl_sum(model, tok, cfg, text: str) -> float:
    """-(summed NLL) of `text` after the start token by the family's own eval-ppl scorer core (its defaults)."""
    from plmcli.eval import memory, state
    from plmcli.eval.perplexity import sequence_nll, start_token, window_length

    seq = np.array([start_token(cfg)] + tok.encode(text, add_special_tokens=False).ids)
    protocol = type(model).traits.scoring
    if protocol == "state":
        nll, n = state.stream_nll(model, seq, 1024)
    elif protocol == "memory":
        tgt, mem = memory.segment_lengths(model, cfg)
        with model.evaluation_memory(mem):
            nll, n = memory.stream_nll(model, seq, tgt)
    else:
        L, _ = window_length(None, model.max_positions, cfg.get("seq_len"))
        fn = (lambda x: model.next_token_logits(x)[0]) if protocol == "left_to_right" else model
        nll, n = sequence_nll(fn, seq, L, max(1, L // 2))
    assert n == len(seq) - 1
    return -nll


@pytest.mark.parametrize("family", ["gpt", "rnn", "transformer_xl", "xlnet"])
def test_requests_equal_plms_own_scores(family, gpt, manager):
    from plmcli.eval.perplexity import start_token
    from plmcli.interop.lm_eval import PlmLM

    model, tok, cfg = gpt if family == "gpt" else triple(family, gpt)
    lm = PlmLM((model, tok, cfg), batch_size=2, device="cpu")
    generates = family != "xlnet"  # plm generate decodes causal LMs and encoder-decoders, not XLNet
    res = evaluate(lm, manager, ["plm_tiny_choice", "plm_tiny_rolling"] + ["plm_tiny_gen"] * generates)
    start = start_token(cfg)
    encode = lm.encode
    checked = 0
    for sample in res["samples"]["plm_tiny_choice"]:
        for (context, continuation), (ll, greedy) in zip((a for a in sample["arguments"]),
                                                          (r[0] for r in sample["resps"])):
            cont = encode(continuation)
            assert encode(context + continuation) == encode(context) + cont  # the split is the plain one here
            lp, argmax = by_hand(model, [start] + encode(context) + cont)
            assert ll == pytest.approx(float(lp[-len(cont):].sum()), abs=1e-4)
            assert greedy == bool((argmax[-len(cont):] == torch.tensor(cont)).all())
            checked += 1
    assert checked == 5
    rolling = res["samples"]["plm_tiny_rolling"]
    assert len(rolling) == 2
    for sample in rolling:
        text = sample["arguments"][0][0]
        assert sample["resps"][0][0] == pytest.approx(eval_ppl_sum(model, tok, cfg, text), abs=1e-4)
    if not generates:
        with pytest.raises(PlmError, match="cannot generate text"):
            evaluate(lm, manager, ["plm_tiny_gen"])
        return
    gen = res["samples"]["plm_tiny_gen"]
    from plmcli.generate import generate

    for sample in gen:
        context = sample["arguments"][0][0]
        out = sample["resps"][0][0]
        full = generate((model, tok, cfg), [context], max_new_tokens=4, strategy="greedy", device="cpu")[0]
        assert full.startswith(out) and not any(s in out for s in (".", "\n"))
    assert set(res["results"]) == {"plm_tiny_choice", "plm_tiny_rolling", "plm_tiny_gen"}


def test_rolling_equals_eval_ppl_of_the_file(gpt, gpt_run, tmp_path):
    """A text's rolling log-likelihood is what plm eval-ppl charges for it: tokens × mean NLL."""
    from lm_eval.api.instance import Instance

    from plmcli.interop.lm_eval import PlmLM

    text = "the cat sat on a mat while dogs ran far away from home\n"
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    rep = api.eval_ppl([str(tmp_path / "t.txt")], str(gpt_run))
    from lm_eval.api.registry import get_model

    assert get_model("plm") is PlmLM  # lm_eval.simple_evaluate(model="plm", model_args="run=...") builds it so
    lm = PlmLM.create_from_arg_string(f"run={gpt_run},device=cpu,batch_size=2")
    req = Instance("loglikelihood_rolling", {}, (text,), 0)
    assert lm.loglikelihood_rolling([req])[0] == pytest.approx(-rep["tokens"] * rep["nll"], abs=1e-4)


def test_a_continuation_starting_with_a_space_and_the_split():
    from plmcli.generate import cut_at_stop
    from plmcli.interop.lm_eval import split_request

    def encode(text):  # one id a word, a leading space glued to its word
        return [hash(w) % 97 for w in text.replace(" ", " _").split()]

    ctx, cont = split_request(encode, "the cat ", "sat")
    assert ctx == encode("the cat") and cont == encode("the cat sat")[2:]
    assert cut_at_stop("abc.def\nx", [".", "\n"]) == "abc" and cut_at_stop("abc", None) == "abc"
    assert cut_at_stop("a\nb", "\n") == "a"


def test_ngram_scores_by_its_counts(tmp_path):
    from plmcli.eval.scoring import token_logprobs

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat\nthe cat ran\nthe dog sat\n" * 5, encoding="utf-8")
    api.pretrain("ngram-bigram-addk", data=[str(corpus)], out=str(tmp_path / "ng"))
    model, tok, cfg = api.load_run(str(tmp_path / "ng"))
    ids = tok.encode("the cat sat", add_special_tokens=False).ids
    lp, hit = token_logprobs(model, ids, cfg)
    words = model.to_ids(ids)
    assert lp[1] == pytest.approx(np.log(model.prob(words[:1], int(words[1]))))
    assert hit[1]  # "cat" is the likeliest word after "the"


def test_a_masked_lm_is_refused_in_one_line(gpt, tmp_path):
    from plmcli.interop.lm_eval import PlmLM

    _, tok, cfg = gpt
    with pytest.raises(PlmError, match="lm-eval scores text left to right, and the given run is a bert model"):
        PlmLM((tiny_model("bert"), tok, {**cfg, "family": "bert"}))


def test_cli_scores_a_local_task(gpt_run, tasks_dir, one_index, tmp_path):
    out = tmp_path / "res.json"
    res = run("lm-eval", gpt_run, "--tasks", "plm_tiny_choice", "--include-path", tasks_dir, "--limit", "2",
              "--batch-size", "2", "--output", out, "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert 0 <= got["tasks"]["plm_tiny_choice"]["acc"] <= 1 and got["n-shot"]["plm_tiny_choice"] == 0
    assert json.loads(out.read_text())["results"]["plm_tiny_choice"]["acc,none"] == got["tasks"]["plm_tiny_choice"]["acc"]
    table = run("lm-eval", gpt_run, "--tasks", "plm_tiny_choice", "--include-path", tasks_dir, "--limit", "1")
    assert table.exit_code == 0 and "plm_tiny_choice" in table.stdout and "acc" in table.stdout


def test_cli_errors_are_one_line(gpt_run, tasks_dir, one_index, tmp_path):
    assert_clean_error(run("lm-eval", gpt_run, "--tasks", "no_such_task_xyz", "--include-path", tasks_dir),
                       "lm-eval has no task 'no_such_task_xyz'")
    assert_clean_error(run("lm-eval", gpt_run, "--tasks", "plm_tiny_choice", "--limit", "0",
                           "--include-path", tasks_dir), "--limit 0")
    bert = tmp_path / "bert"
    bert.mkdir()
    cfg = json.loads((gpt_run / "config.json").read_text())
    model_section = {k: v for k, v in zip(("n_layer", "d_model", "n_head", "d_ff", "max_positions", "vocab_size"),
                                          (2, 32, 2, 64, 18, 50))}
    (bert / "config.json").write_text(json.dumps({**cfg, "family": "bert", "model": model_section}))
    (bert / "model.safetensors").write_bytes(b"")  # refused from config.json: the weights are never read
    assert_clean_error(run("lm-eval", bert, "--tasks", "plm_tiny_choice", "--include-path", tasks_dir),
                       "is a bert model")


def test_without_the_harness_one_line(monkeypatch, gpt_run):
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(PlmError, match=r"plm lm-eval needs lm_eval, which is not installed — pip install 'plm\[lm-eval\]'"):
        api.lm_eval(str(gpt_run), "plm_tiny_choice")
