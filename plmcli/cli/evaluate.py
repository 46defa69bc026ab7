"""`plm eval-ppl`, `plm eval-vectors`, `plm generate` and `plm zero-shot`: the commands that use a trained run."""

from __future__ import annotations

from typing import List, Optional

import typer

from plmcli.cli._common import Commands, print_json
from plmcli.errors import PlmError

commands = Commands()


# ---------------------------------------------------------------- eval-ppl


@commands.command("eval-ppl")
def eval_ppl(
    files: List[str] = typer.Argument(..., help="Text files to score (each one continuous text), or JSON Lines / CSV / "
                                      "Parquet files, a save_to_disk directory (its test split, else validation) or a Hub "
                                      "dataset NAME[:CONFIG[:SPLIT]]: rows read as text separated by blank lines."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Run directory (default runs/latest)."),
    max_length: Optional[int] = typer.Option(None, help="Tokens the model reads per window (default: the run's training "
                                             "seq_len, capped by the model's positions)."),
    stride: Optional[int] = typer.Option(None, help="New tokens scored per window (default max_length/2; = max_length: no overlap)."),
    batch_size: int = typer.Option(8, help="Windows per forward pass (masked LMs: --max-tokens-per-batch)."),
    mem_len: Optional[int] = typer.Option(None, help="Models with memory (Transformer-XL, XLNet): states kept per layer, "
                                          "0 = none (default: the recipe's eval_mem_len, else mem_len)."),
    tgt_len: Optional[int] = typer.Option(None, help="Models with memory: tokens per segment (default: the recipe's "
                                          "eval_tgt_len, else the training seq_len)."),
    max_tokens_per_batch: Optional[int] = typer.Option(None, help="Masked LMs: input tokens per forward pass "
                                                       "(masked copies × their length; default 8192)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: ppl, nll, tokens, bpb, bytes, words, word_ppl, stride, "
                                 "max_length, window_from (masked LMs: also pseudo: true)."),
    text_column: Optional[str] = typer.Option(None, "--text-column", help="The text column of JSON Lines / CSV / Parquet files, "
                                              "saved datasets and Hub datasets (default: text)."),
):
    """Perplexity of a causal LM on text, every token scored exactly once (masked LMs: pseudo-perplexity).

    Windows of --max-length tokens move by --stride; each window scores only its new tokens, so every
    token gets between max_length-stride and max_length tokens of context. The default window is the
    length the run trained on (config.json's seq_len; gpt-mini: 128 of its 256 positions), since positions
    it never trained make perplexity worse, not better; the output says which window and why. The first
    token is scored given the tokenizer's BOS/EOS when it has one (else it is context only; it says which).

    Also reports bits per byte (comparable across tokenizers) and word-level perplexity. Bytes are those
    of the text as scored: UTF-8, every line ending in one LF (a CRLF file counts as its LF copy, as
    Python's text mode reads it; a BOM is dropped, a missing final newline added). n-gram runs score
    each line as a sentence (N-1 <s> before it, </s> scored), ignore the windows and report the OOV rate.

    Transformer-XL reads the text in segments of --tgt-len tokens, each attending to --mem-len cached
    states per layer (no windows): plm eval-ppl wiki.test.tokens --tgt-len 128 --mem-len 1600

    Masked LMs (BERT, RoBERTa, ALBERT, SpanBERT, NEZHA, ERNIE; ELECTRA's generator) report pseudo-perplexity
    (Salazar et al. 2020): each line is a sentence, each of its tokens is masked in turn and scored given
    the rest ([CLS]/[SEP] not scored); a line longer than --max-length is scored in windows centred on
    each token: plm eval-ppl valid.txt --model runs/bert-mini --json

    Example: plm eval-ppl wiki.test.raw --model runs/latest --max-length 1024 --stride 512 --json
    """
    from plmcli import api

    res = api.eval_ppl(files, model, max_length, stride, batch_size, mem_len=mem_len, tgt_len=tgt_len,
                       max_tokens_per_batch=max_tokens_per_batch, text_column=text_column)
    if as_json:
        return print_json({k: v for k, v in res.items() if k != "files"} | {"files": res["files"]})
    if res.get("pseudo"):
        return typer.echo(f"pseudo-perplexity (Salazar et al. 2020) {res['ppl']:.3f}  nll {res['nll']:.4f}  "
                          f"tokens {res['tokens']:,} in {res['sentences']:,} sentences  bpb {res['bpb']:.4f}  "
                          f"word ppl {res['word_ppl']:.3f} ({res['words']:,} words)  window ≤ {res['max_length']}, centred "
                          f"({res['window_from']})")
    context = (f"segment {res['tgt_len']} memory {res['mem_len']}" if "mem_len" in res
               else f"window {res['max_length']}/{res['stride']}"
               + (f" ({res['window_from']})" if "window_from" in res else ""))
    typer.echo(f"ppl {res['ppl']:.3f}  nll {res['nll']:.4f}  tokens {res['tokens']:,}  bpb {res['bpb']:.4f}  "
               f"word ppl {res['word_ppl']:.3f} ({res['words']:,} words)  {context}  "
               f"first token {res['first_token']}" + (f"  oov {res['oov_rate']:.2%}" if "oov_rate" in res else "")
               + (f"  zero-probability tokens {res['zero_prob_tokens']:,} (ppl of the rest "
                  f"{res['ppl_excluding_zero_prob']:.3f})" if res.get("zero_prob_tokens") else "")
               + (f"  ({res['factorisation']} factorisation)" if "factorisation" in res else ""))


# ---------------------------------------------------------------- eval-vectors


@commands.command("eval-vectors")
def eval_vectors(
    vectors: Optional[str] = typer.Argument(None, help="A word2vec run directory (default runs/latest), or a word2vec text "
                                            "file (`plm export --format word2vec`, gensim's save_word2vec_format)."),
    analogies: Optional[str] = typer.Option(None, "--analogies", help="Word analogies in the questions-words.txt format: "
                                            "': section' lines, then 'a b c d' lines (a is to b as c is to d)."),
    similarity: Optional[str] = typer.Option(None, "--similarity", help="Word pairs in the WordSim-353 format: "
                                             "word1 TAB word2 TAB score, '#' comment lines."),
    restrict_vocab: int = typer.Option(300000, help="Only the first N words of the vectors (a run's: most frequent first)."),
    case_sensitive: bool = typer.Option(False, "--case-sensitive", help="Compare words as written (default: upper-cased, "
                                        "the first case of a word standing for it)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: per-section and total accuracy, OOV counts, "
                                 "Spearman's ρ and Pearson's r."),
):
    """Score static word vectors on word analogies and word similarity, as gensim's KeyedVectors does.

    Analogies: 3CosAdd over unit vectors (the word nearest b̂ + ĉ − â, a, b and c excluded), accuracy per
    section and in total; a question with a word outside the vocabulary is skipped and counted as OOV.
    Similarity: Spearman's ρ between the cosines and the human scores; OOV pairs are counted and left out.
    gensim ships both standard files in gensim/test/test_data.

    Example: plm eval-vectors runs/latest --analogies questions-words.txt --similarity wordsim353.tsv
    """
    from plmcli import api

    res = api.eval_vectors(vectors, analogies, similarity, restrict_vocab, not case_sensitive)
    if as_json:
        return print_json(res)
    typer.echo(f"{res['vectors']}: {res['words']:,} words × {res['dim']}, the first {res['restrict_vocab']:,} scored")
    if "analogies" in res:
        a = res["analogies"]
        for s in a["sections"]:
            typer.echo(f"  {s['section']:<28} {s['accuracy']:7.2%}  ({s['correct']}/{s['scored']}, {s['oov']} OOV)")
        typer.echo(f"analogies {a['accuracy']:.2%} ({a['correct']:,}/{a['scored']:,}); {a['oov']:,} of "
                   f"{a['questions']:,} questions skipped as OOV ({a['oov_ratio']:.1%})")
    if "similarity" in res:
        s = res["similarity"]
        typer.echo(f"similarity Spearman ρ {s['spearman']:.4f}  Pearson r {s['pearson']:.4f}  over {s['pairs']} pairs; "
                   f"{s['oov']} OOV ({s['oov_ratio']:.1%})")


# ---------------------------------------------------------------- generate


@commands.command()
def generate(
    run: Optional[str] = typer.Argument(None, help="Run directory (default runs/latest)."),
    prompts: Optional[List[str]] = typer.Option(None, "--prompt", "-p", help="Prompt text (repeatable); for an encoder-decoder run, the source."),
    input_file: Optional[str] = typer.Option(None, "--input", "-i", help="A file of prompts, one per line (blank lines skipped; '-' = stdin)."),
    max_new_tokens: int = typer.Option(50, help="Generate at most this many tokens (stops earlier at eos)."),
    strategy: str = typer.Option("greedy", help="greedy | beam | sample."),
    num_beams: int = typer.Option(4, help="Beams for --strategy beam."),
    top_k: int = typer.Option(0, help="sample: only the k most likely tokens (0 = no limit)."),
    top_p: float = typer.Option(1.0, help="sample: only the smallest set of tokens with probability ≥ p (1 = no limit)."),
    temperature: float = typer.Option(1.0, help="sample: divide the logits by this first (< 1 sharper, > 1 flatter)."),
    seed: int = typer.Option(0, help="sample: seed of the sampler (the same seed gives the same text)."),
    length_penalty: float = typer.Option(1.0, help="beam: hypotheses ranked by log-probability / length^this."),
    batch_size: int = typer.Option(16, help="Prompts decoded together."),
    stop: Optional[List[str]] = typer.Option(None, "--stop", help="greedy / sample: a row ends once its text holds "
                                             "this string, and every output is cut before it (repeatable; \\n and "
                                             "\\t are a newline and a tab), e.g. --stop '\\n'."),
    as_json: bool = typer.Option(False, "--json", help="Print [{prompt, output}, ...] as JSON."),
):
    """Generate text from a run: a causal LM continues each prompt; an encoder-decoder (seq2seq,
    transformer) translates it (or, trained with denoising, restores it).

    Greedy, beam search (length-normalized, stops once num_beams hypotheses end), or sampling with
    temperature, top-k and top-p (nucleus). Prints each output (only the generated text) on its own
    line; use --json to keep prompts and multi-line outputs apart.

    Example: plm generate runs/latest --prompt "First Citizen:" --strategy sample --top-p 0.9 --max-new-tokens 100
    """
    from plmcli import api
    from plmcli.cli._common import stderr

    rows = api.generate(run, prompts, input_file, max_new_tokens, strategy, num_beams, top_k, top_p, temperature,
                        seed, length_penalty, batch_size, console=stderr(),
                        stop=[s.replace("\\n", "\n").replace("\\t", "\t") for s in stop or []])
    if as_json:
        return print_json(rows)
    for row in rows:
        typer.echo(row["output"])


# ---------------------------------------------------------------- zero-shot


@commands.command("zero-shot")
def zero_shot(
    run: Optional[str] = typer.Argument(None, help="Run directory (default runs/latest) of a causal LM."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="sst2 (or another GLUE classification task, "
                                       "classification, pair-classification), swag, race, lambada, or (generated) "
                                       "translation, squad; a shipped config sets its prompt (sst2, race, swag, "
                                       "lambada, translation, squad). Default sst2."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="A zero-shot config YAML (keys: task, split, "
                                         "data_dir, data, prompt, verbalizers, option, score, max_examples; score "
                                         "generate: metric, shot, shots, turn, stop, max_new_tokens)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="The task's data folder, as for plm finetune "
                                           "(glue-sample: the shipped SST-2 sample)."),
    data: Optional[str] = typer.Option(None, "--data", help="lambada: the text file, one passage a line; "
                                      "translation: source<TAB>target pairs; squad: SQuAD- or CoQA-format JSON "
                                      "(default: a shipped sample)."),
    split: Optional[str] = typer.Option(None, "--split", help="The split scored (default dev)."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Template before each continuation: {text} {text_b} "
                                         "(labels), {context} {question} (options); score generate: before the "
                                         "generated answer ({source}; {context} {history} {question})."),
    verbalizer: Optional[List[str]] = typer.Option(None, "--verbalizer", help="LABEL=TEXT, the continuation for a "
                                                   "label (repeat for every label), e.g. 'positive= It was great.'"),
    option: Optional[str] = typer.Option(None, "--option", help="How an option continues the prompt (default ' {option}')."),
    score: Optional[str] = typer.Option(None, "--score", help="sum | mean log-likelihood of a continuation picks the "
                                        "prediction (default: sum for labels, mean for options); generate: "
                                        "the model writes it (translation, squad)."),
    max_examples: Optional[int] = typer.Option(None, "--max-examples", help="Score the first N examples only (0 = all)."),
    shots: Optional[int] = typer.Option(None, "--shots", help="score generate: solved examples (the data's first rows, "
                                        "not scored) before each prompt (translation: 4)."),
    max_length: Optional[int] = typer.Option(None, help="Tokens a row reads (default: the run's training seq_len, "
                                             "capped by its positions); longer prompts lose their start."),
    batch_size: int = typer.Option(8, help="Rows (example × continuation) per forward pass."),
    predictions: Optional[str] = typer.Option(None, "--predictions", help="Write one JSON line per example: id, label, "
                                              "prediction, log-likelihood and tokens of each continuation "
                                              "(generated: id, prediction, references)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: the metrics and what was asked."),
):
    """Score a task with a causal LM and no finetuning: the likelihood of each verbalised label or option.

    Classification: each label's verbaliser continues the prompt (SST-2's shipped config: "{text}" then
    " It was great." / " It was terrible."); the most likely one is the prediction. Multiple choice (swag,
    race): each option continues the prompt. --score sum is log P(continuation | prompt), mean divides it by
    the continuation's tokens; both accuracies are reported. lambada: the last word of each line predicted
    from the rest; accuracy counts words whose every token is the argmax, ppl is over the last words.
    Generated (--score generate; GPT-2's translation and reading comprehension): the model continues the
    prompt greedily until a newline; translation is scored by BLEU, squad by SQuAD's F1 and exact match.

    Example: plm zero-shot runs/gpt --task sst2 --data-dir glue-sample --verbalizer 'positive= Great!' --verbalizer 'negative= Awful!'
    """
    from plmcli import api

    verbalizers = None
    if verbalizer:
        bad = [v for v in verbalizer if "=" not in v]
        if bad:
            raise PlmError(f"--verbalizer {bad[0]!r} is not LABEL=TEXT", "e.g. --verbalizer 'positive= It was great.'")
        verbalizers = dict(v.split("=", 1) for v in verbalizer)
    res = api.zero_shot(run, task=task, config=config, data_dir=data_dir, data=data, split=split, prompt=prompt,
                        verbalizers=verbalizers, option=option, score=score, max_examples=max_examples,
                        max_length=max_length, batch_size=batch_size, predictions=predictions, shots=shots)
    summary = {k: v for k, v in res.items() if k != "predictions"}
    if as_json:
        return print_json(summary)
    if res["kind"] == "lambada":
        return typer.echo(f"zero-shot lambada: last-word accuracy {res['accuracy']:.4f}  ppl {res['ppl']:.3f}  "
                          f"({res['examples']:,} passages, {res['tokens']:,} tokens)  window {res['window']}")
    if res["kind"] == "generate":
        metrics = "  ".join(f"{k} {v:.2f}" for k, v in res.items() if isinstance(v, float))
        return typer.echo(f"zero-shot {res['task']}: {metrics}  ({res['examples']:,} examples, {res['shots']}-shot, "
                          f"greedy until {res['stop']!r})")
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in res.items() if isinstance(v, float) and not k.startswith("accuracy_"))
    typer.echo(f"zero-shot {res['task']} {res['split']}: {metrics}  ({res['examples']:,} examples, score {res['score']}; "
               f"accuracy by sum {res['accuracy_sum']:.4f}, by mean {res['accuracy_mean']:.4f})  window {res['window']}")


# ---------------------------------------------------------------- lm-eval


@commands.command("lm-eval")
def lm_eval(
    run: Optional[str] = typer.Argument(None, help="Run directory (default runs/latest) of a causal LM (gpt, rnn, nnlm, "
                                        "transformer_xl, xlnet, ngram)."),
    tasks: str = typer.Option(..., "--tasks", "-t", help="lm-evaluation-harness task names, comma-separated "
                              "(e.g. lambada_openai,hellaswag), or those of --include-path YAMLs."),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help="Examples before each question (default: "
                                              "the task's own)."),
    limit: Optional[float] = typer.Option(None, "--limit", help="Score the first N documents of each task (below 1: that share)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Windows per forward pass (prompts per generation batch)."),
    include_path: Optional[str] = typer.Option(None, "--include-path", help="A folder of task YAMLs of your own."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the harness' results and task configs as JSON."),
    bootstrap_iters: int = typer.Option(100000, "--bootstrap-iters", help="Bootstrap samples for some metrics' stderr "
                                        "(0: none)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: run, tasks (task -> metric -> value), n-shot, versions."),
):
    """Score lm-evaluation-harness tasks with a plm run: each request by the scorer plm eval-ppl uses for the family.

    loglikelihood requests sum log P(continuation | context) over the continuation's tokens; loglikelihood_rolling
    ones score the whole text as eval-ppl does (sliding windows for GPT, the state carried for RNNs, memory for
    Transformer-XL, left to right for XLNet, counts for n-grams); generate_until decodes greedily until a stop
    string. Masked LMs (BERT, ...) and encoder-decoders are refused. Needs pip install 'plm[lm-eval]'.

    Example: plm lm-eval runs/gpt --tasks lambada_openai,hellaswag --limit 100 --json
    """
    from plmcli import api

    res = api.lm_eval(run, tasks, num_fewshot=num_fewshot, limit=limit, batch_size=batch_size,
                      include_path=include_path, output=output, bootstrap_iters=bootstrap_iters)
    if as_json:
        return print_json(res)
    width = max(len(t) for t in res["tasks"]) if res["tasks"] else 4
    typer.echo(f"{'task':<{width}}  {'n-shot':>6}  metric")
    for task, metrics in res["tasks"].items():
        shown = "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()
                          if not k.endswith("_stderr") and isinstance(v, (int, float)))
        typer.echo(f"{task:<{width}}  {res['n-shot'].get(task, ''):>6}  {shown}")
    if res.get("output"):
        typer.echo(f"results written to {res['output']}")
