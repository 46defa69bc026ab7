"""`plm` commands that look inside runs and move them between tools: plot, export, import, attention, probe."""

from __future__ import annotations

from typing import List, Optional

import typer

from plmcli.cli._common import Commands, print_json, stderr

commands = Commands()


# ---------------------------------------------------------------- plot


@commands.command()
def plot(
    runs: List[str] = typer.Argument(..., help="Run directories (each with a metrics.jsonl); several are overlaid."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="PNG to write (default RUN/plots.png for one run, ./plm-plot.png for several)."),
    metrics: Optional[str] = typer.Option(None, help="Comma-separated metrics, one panel each (default: loss, every val_* logged, lr)."),
    x: str = typer.Option("step", "--x", help="x axis: step | tokens."),
):
    """Draw training curves from runs' metrics.jsonl: one panel per metric, runs overlaid.

    Losses and perplexities that fall over a wide range get a log y axis. Malformed lines of a
    metrics.jsonl (one cut short by a run still writing) are skipped and counted on stderr.

    Example: plm plot runs/gpt-mini-a runs/gpt-mini-b --metrics loss,val_loss,lr --x tokens --out curves.png
    """
    from plmcli import api

    res = api.plot(runs, out, [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None, x)
    for label, n in res["skipped_lines"].items():
        typer.echo(f"warning: skipped {n} malformed line{'s' * (n > 1)} of {label}/metrics.jsonl", err=True)
    typer.echo(f"wrote {res['out']} ({', '.join(res['metrics'])} by {res['x']}; {len(res['runs'])} run{'s' * (len(res['runs']) > 1)})")


# ---------------------------------------------------------------- export


@commands.command()
def export(
    run: Optional[str] = typer.Argument(None, help="Run directory (default runs/latest), or a Hugging Face Hub model id."),
    format: str = typer.Option(..., "--format", "-f", help="arpa: n-gram runs, in the KenLM/SRILM back-off format; "
                               "hf: a transformers directory (runs of the families with a transformers counterpart: any other run's refusal "
                               "names them); "
                               "word2vec: word2vec runs, in the word2vec text format (gensim, fastText, … read it)."),
    out: str = typer.Option(..., "--out", "-o", help="File (arpa, word2vec) or directory (hf) to write."),
    force: bool = typer.Option(False, "--force", help="hf: replace an existing non-empty --out directory."),
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", metavar="REPO",
                                              help="hf: then upload --out to this Hugging Face Hub model repo "
                                              "(ORG/NAME, created if missing; needs a login: hf auth login)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
):
    """Write a finished run in another tool's format.

    hf writes config.json, model.safetensors and tokenizer files that transformers' AutoModelFor… and
    AutoTokenizer .from_pretrained(DIR) load; a finetuned classifier becomes *ForSequenceClassification
    where transformers has the same head (else its encoder is exported, and the output says so).

    Example: plm pretrain --recipe ngram-kn5 --data train.txt && plm export runs/latest --format arpa --out lm.arpa

    Example: plm export runs/bert-mini --format hf --out hf/bert-mini

    Example: plm export runs/latest --format word2vec --out vectors.txt

    Example: plm export runs/bert-mini --format hf --out hf/bert-mini --push-to-hub me/bert-mini
    """
    from plmcli import api

    res = api.export(run, format, out, force, push_to_hub)
    if as_json:
        return print_json(res)
    what = f": {res['architecture']} ({res['model_type']}), {res['parameters']:,} parameters" if "architecture" in res else ""
    pushed = f"; pushed to {res['pushed']['url']}" if res.get("pushed") else ""
    typer.echo(res["out"] + what + "".join(f"; {note}" for note in res.get("notes", [])) + pushed)


# ---------------------------------------------------------------- import


@commands.command("import")
def import_run(
    hf_dir: str = typer.Argument(..., metavar="HF_DIR|NAME",
                                 help="A local transformers model directory (config.json, model.safetensors or "
                                 "pytorch_model.bin, tokenizer.json or vocab.txt or vocab.json + merges.txt), or a "
                                 "Hugging Face Hub model id: bert-base-uncased, ORG/NAME, ORG/NAME@REVISION."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Run directory to write (required for a local "
                                      "directory; a Hub id's default is runs/hub/ORG--NAME, which every command "
                                      "taking a run reads for that id)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing non-empty --out directory (a Hub id: "
                               "fetch and convert it again)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
):
    """Turn a transformers checkpoint into a plm run that finetune, eval-ppl and generate read.

    Model types: bert, roberta, gpt2, openai-gpt, albert, electra, xlnet. A Hub id is downloaded (only
    config.json, the weights and the tokenizer files) through the Hugging Face cache, which HF_HUB_OFFLINE=1
    keeps to what it holds. Parts of the plm model the checkpoint lacks (a bare BertModel has no MLM head) are
    initialised fresh and listed.

    Example: plm import ~/models/bert-base-uncased --out runs/bert-base && plm finetune --task sst2 --from runs/bert-base

    Example: plm import bert-base-uncased  (then --from bert-base-uncased, --model ... read the converted run)
    """
    from plmcli import api

    res = api.import_hf(hf_dir, out, force)
    if as_json:
        return print_json(res)
    if res.get("reused"):
        return typer.echo(f"{res['out']}: {hf_dir} is imported already (--force fetches and converts it again)")
    fresh = f"; fresh (not in the checkpoint): {', '.join(res['fresh'])}" if res["fresh"] else ""
    kind = ": ".join([res["model_type"], *res["architectures"][:1]]) if res["architectures"] else res["model_type"]
    typer.echo(f"{res['out']}: {res['family']} run from {hf_dir} ({kind}), {res['parameters']:,} parameters, "
               f"vocab {res['vocab_size']:,}{fresh}")


# ---------------------------------------------------------------- attention


@commands.command()
def attention(
    run: str = typer.Argument(..., help="Run directory (pretrained or finetuned) of a family built on plm's self-attention "
                             "layers (any other run's refusal names them)."),
    text: Optional[str] = typer.Argument(None, help="The text whose attention is drawn (default: the first line of --corpus)."),
    text_pair: Optional[str] = typer.Option(None, "--text-pair", help="Encoders: a second text, read as [CLS] TEXT [SEP] PAIR [SEP]."),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="Average the statistics over this file's lines (a tab splits a line into a pair)."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory: layer_{i}.png, patterns.png, attention.tsv, attention.json."),
    max_seq_len: Optional[int] = typer.Option(None, help="Tokens per input, special tokens included (default: the model's positions)."),
    max_lines: Optional[int] = typer.Option(None, help="--corpus: read at most this many non-blank lines."),
    batch_size: int = typer.Option(16, help="--corpus: lines per forward pass (every layer's maps are held at once)."),
    as_json: bool = typer.Option(False, "--json", help="Print attention.json instead of the table."),
):
    """Where each attention head looks (Clark et al. 2019): a heatmap per layer, the patterns per head,
    and a layer × head heatmap per pattern (patterns.png).

    Per layer × head: entropy (nats) and the share of attention on the next token, the previous token,
    [CLS], [SEP] and the token itself, averaged over real query tokens (over every line of --corpus,
    padding excluded); on other occurrences of the same token id and of the same word (anywhere, and in the
    other sentence of a pair), over the tokens that recur; on punctuation (tokens whose text is all
    Unicode P* characters); and entropy ÷ uniform attention's entropy, with the broad heads (≥ 0.9)
    listed. Causal runs (gpt):
    [CLS] is the first token, [SEP] the bos/eos tokens, next and the other sentence are n/a.

    Example: plm attention runs/bert-mini "the cat sat on the mat" --text-pair "it was warm" --out att/

    Example: plm attention runs/gpt-mini --corpus valid.txt --max-lines 500 --out att/ --json
    """
    from plmcli import api

    res = api.attention(run, text, text_pair, corpus, out, max_seq_len, batch_size, max_lines)
    if as_json:
        return print_json(res)
    api.print_attention(res)


# ---------------------------------------------------------------- probe


@commands.command()
def probe(
    run: Optional[str] = typer.Argument(None, help="Run directory (pretrained or finetuned; default runs/latest) of a family with "
                                        "per-layer states (any other run's refusal names them)."),
    task: str = typer.Option(..., "--task", "-t", help="pos | chunk | ner: CoNLL-2003's column 2, 3 or 4."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="The CoNLL-2003 folder (eng.train + eng.testa, or train.txt + valid.txt)."),
    train: Optional[str] = typer.Option(None, "--train", help="Train file (word POS chunk NER per line) instead of --data-dir's."),
    dev: Optional[str] = typer.Option(None, "--dev", help="Dev file the probes are scored on."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory: probe.json, probe.tsv, probe_TASK.png."),
    max_sentences: int = typer.Option(2000, help="Train sentences, drawn at random (seeded) when the file has more."),
    max_dev_sentences: int = typer.Option(500, help="Dev sentences, drawn the same way."),
    seed: int = typer.Option(0, help="Seeds the sentence sample (the probe itself is convex: no randomness)."),
    batch_size: int = typer.Option(32, help="Sentences per forward pass."),
    as_json: bool = typer.Option(False, "--json", help="Print probe.json instead of the table."),
):
    """A linear probe per layer (Tenney et al. 2019, Liu et al. 2019): how well POS, chunk or NER tags
    can be read off each layer's frozen word vectors (a word = its first sub-token).

    One multinomial logistic regression per layer (0 = embeddings) on the train words, scored on the
    dev words (accuracy, macro-F1), next to the majority-tag baseline. gpt: left context only.

    Example: plm probe runs/bert-mini --task pos --data-dir conll2003/ --out probe-pos/
    """
    from plmcli import api

    res = api.probe(run, task, out, data_dir, train, dev, max_sentences, max_dev_sentences, seed, batch_size,
                    console=stderr())
    if as_json:
        return print_json(res)
    api.print_probe(res)
