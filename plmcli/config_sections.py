"""Typed recipe sections. Attribute docstrings double as the reference in `plm recipes show --help`.

A field's allowed values are declared in its type (config_schema.py: `Literal[...]` for a choice,
`Annotated[int, Range(1)]` for an interval, `Divides("d_model")`, `Rule`), and config_schema.build_section checks
them when a recipe (or a run's config.json) is loaded. The name lists of the settings that pick an implementation
(optimizer, schedule, tokenizer, trackers) live here, so a recipe is checked against them before anything is built.

`plm finetune`'s config shares the train and optim sections (config.TrainConfig, OptimConfig) with other
defaults, and has three of its own (task, model, grid: the Finetune* classes at the end), checked by the same
machinery; `TaskOptions`, the part of the task section the tasks read, is re-exported by plmcli.data.tasks.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Annotated, Literal, Optional

from plmcli.config_schema import Axis, Count, NonNegative, Positive, Probability, Range, Rule, Size


OptimizerName = Literal["adamw", "adam", "lamb", "sgd"]
"""optim.name: what train/optim.build_optimizer builds."""
ScheduleName = Literal["linear", "cosine", "constant", "inverse-sqrt", "polynomial", "step"]
"""optim.schedule: what train/schedule.build_scheduler builds."""
MixedPrecision = Literal["auto", "no", "bf16", "fp16"]
"""train.mixed_precision: what the loop's Accelerator runs in."""
TokenizerKind = Literal["wordpiece", "bpe", "bytelevel-bpe", "unigram", "char", "word"]
"""tokenizer.kind: what data/tokenizers.train_tokenizer trains."""
TRACKERS = ("tensorboard", "wandb", "mlflow", "aim")
"""train.report_to: the accelerate trackers (train/trackers.py) a run's metrics may go to."""
ReportTo = Annotated[list[str], Rule(lambda v, _: v == ["none"] or (len(set(v)) == len(v) and set(v) <= set(TRACKERS)),
                                     "must be tensorboard, wandb, mlflow or aim (several allowed), or none",
                                     "e.g. --set {where}.report_to=tensorboard,mlflow (or none)")]
"""train.report_to: tracker names, a YAML list or a comma string; none (or an empty list) = no tracker."""


def default_trackers() -> list[str]:
    """train.report_to's default: tensorboard where its package is installed, else none."""
    return ["tensorboard"] if importlib.util.find_spec("tensorboard") is not None else []


@dataclass
class TokenizerConfig:
    kind: TokenizerKind = "bytelevel-bpe"
    """wordpiece | bpe | bytelevel-bpe | unigram | char | word (whitespace words; each CJK ideograph a word)."""
    vocab_size: Size = 8192
    """Target vocabulary size, special tokens included (char/word: an upper bound)."""
    min_frequency: Count = 2
    """Pieces (or words, chars) seen fewer times than this are not added."""
    lowercase: bool = False
    """Lower-case (and for wordpiece, strip accents) before tokenizing."""
    segment: Literal["char", "jieba"] = "char"
    """word only — Chinese text: char = each CJK ideograph a word; jieba = jieba's words (the vocabulary is jieba's
    segmentation of the corpus, each unit scored by its frequency; text is cut into the most probable sequence of
    them, as jieba cuts by its dictionary)."""
    special_tokens: dict = field(default_factory=lambda: {"eos": "<|endoftext|>"})
    """Role -> token string, roles from: bos eos pad unk mask cls sep. The same string may fill several roles."""
    path: Optional[str] = None
    """Load this tokenizer.json instead of training one."""


@dataclass
class DataConfig:
    path: Optional[str] = None
    """Text file(s)/dir or a `plm tokenize` output dir; empty = the small corpus shipped with plm."""
    default_data: Optional[str] = None
    """The shipped sample (a file in plmcli/corpus/) used when neither --data nor path is given; empty = the objective's."""
    text_column: str = "text"
    """The column that holds the text in JSON Lines / CSV / Parquet files, saved datasets and Hub datasets."""
    doc_per_line: bool = False
    """Each line is a document (else documents are separated by blank lines and lines are sentences)."""
    split_sentences: bool = False
    """Cut lines into sentences at sentence-final punctuation (plmcli/data/sentences.py), for text that is not
    one sentence per line: NSP/SOP pairs and make-mlm-data's segments are built from those sentences."""
    val_fraction: Probability = 0.05
    """Share of documents (taken from the end of the corpus) held out for validation."""
    num_proc: Size = 1
    """Worker processes for tokenization."""
    mix: Annotated[Optional[dict[str, float]], Rule(lambda v, _: sum(v.values()) > 0 and all(
        type(w) in (int, float) and 0 <= w < float("inf") for w in v.values()), "must map sources to weights ≥ 0, some > 0",
        "e.g. data: {{mix: {{a.txt: 0.7, b.txt: 0.3}}}}")] = None
    """Weighted mixing (data/mixing.py; every objective whose batches are independent samples: clm, bilm, mlm, rtd,
    ernie2, translation, denoising): source (as --data takes it) -> weight, normalised; sequences
    come from each source in its share. `--data a.txt:0.7 --data b.txt:0.3` replaces it. Empty: one concatenation."""


# ---------------------------------------------------------------- finetuning (config.FinetuneConfig)


@dataclass
class TaskOptions:
    """Task settings from `plm finetune`'s options; each task reads the ones that concern it.

    Their ranges are checked by the objectives that read them (naming the flag), not here: a finetuned
    run's config.json keeps these fields as they are."""

    train: str | None = None
    """A training file of the task's format (own data TSV/CSV/JSONL, SQuAD JSON, CoNLL, SWAG CSV), instead of
    data_dir."""
    dev: str | None = None
    """The matching dev file: evaluated every epoch, its main metric keeps the best weights."""
    test: str | None = None
    """A test file: predictions are written for it."""
    text_col: str | None = None
    """Own data: the column (TSV/CSV header or JSONL key) holding the text."""
    text_pair_col: str | None = None
    """Own data: the column of the second text of a pair."""
    label_col: str | None = None
    """Own data: the label column."""
    doc_stride: Size = 128
    """Span QA: tokens between the starts of consecutive windows over a long passage."""
    max_query_len: Size = 64
    """Span QA: question tokens kept."""
    max_answer_len: Size = 30
    """Span QA: longest answer decoded, in tokens."""
    n_best: Size = 20
    """Span QA: start and end candidates combined per window."""
    crf: bool = False
    """Token classification (NER): a linear-chain CRF over the tag scores, Viterbi decoding."""
    aux_lm_weight: NonNegative = 0.5
    """Causal runs (GPT-style transfer): λ, the weight of the auxiliary language-modelling loss; 0 = the task
    loss alone."""


@dataclass
class FinetuneTaskConfig(TaskOptions):
    """finetune's `task` section: which task, where its data is, how long an example may be, and the
    TaskOptions the task itself reads."""

    name: Optional[str] = None
    """The task: GLUE (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli), span QA (squad, cmrc2018), NER
    (conll2003), multiple choice (swag, race), or own data (classification, regression, pair-classification).
    Required."""
    data_dir: Optional[str] = None
    """The task's data folder (GLUE: holding SST-2/, CoLA/, … or one task's folder; SQuAD, CoNLL, SWAG, own data:
    their files; glue-sample: the SST-2 sample shipped with plm); none = train/dev/test, else the Hub."""
    max_seq_len: Optional[Annotated[int, Range(8)]] = None
    """Tokens per example, special tokens included; none = min(128, the model's positions)."""


FinetuneFeatures = Literal["last", "scalar_mix", "concat_last_four"]
"""model.features: what the task head reads — the last layer (its pooled [CLS] where the encoder has a pooler),
a learned scalar mix γ·Σ softmax(s)_j h_j of every layer, embeddings included (ELMo eq. 1), or the last four
layers concatenated (BERT's best feature-based NER, Devlin et al. 2018 §5.3)."""

FinetuneInit = Literal["pretrained", "random"]
"""model.init: the run's weights, or the same architecture freshly initialised (the baseline that shows
what pretraining buys)."""


@dataclass
class FinetuneModelConfig:
    """finetune's `model` section: the run finetuned and what changes in it."""

    from_run: Optional[str] = None
    """The run directory finetuned (a pretrained run, or a finetuned one: its encoder); none = runs/latest."""
    init: FinetuneInit = "pretrained"
    """pretrained | random (same architecture, fresh weights: the baseline)."""
    dropout: Optional[Probability] = None
    """The backbone's dropout and attention dropout while finetuning; none = the run's own."""
    classifier_dropout: Optional[Probability] = None
    """Dropout before the task head; none = the backbone's dropout."""
    freeze: bool = False
    """Feature-based: the backbone's weights stay as pretrained (eval mode, no backward through it); only the
    task head (and a scalar mix) train."""
    features: FinetuneFeatures = "last"
    """last | scalar_mix | concat_last_four: what the head reads (scalar_mix and concat_last_four take the
    [CLS] position of the mixed states, not the pretrained pooler)."""
    elmo_at_output: bool = False
    """ELMo runs, sequence tasks: ELMo vectors also at the task BiLSTM's output, with their own scalar mix
    (Peters et al. 2018 §3.3)."""


def _module_names(names, _) -> bool:
    return len(set(names)) == len(names) and all(n and n.strip(".") == n and " " not in n for n in names)


@dataclass
class FinetuneLoraConfig:
    """finetune's `lora` section: low-rank adapters (Hu et al. 2021) instead of updating the backbone. Every
    backbone weight stays as pretrained; W x becomes W x + (alpha / r) B A x in the adapted Linear layers, only
    A and B (and the task head) train, and at the end B A is merged into W: OUT/model.safetensors is a plain
    model, OUT/adapter.safetensors the adapters alone (plmcli.train.lora)."""

    r: Count = 0
    """The adapters' rank; 0 = no LoRA (the whole backbone trains)."""
    alpha: Positive = 16.0
    """Scale numerator: the update B A is multiplied by alpha / r."""
    dropout: Probability = 0.0
    """Dropout on an adapter's input (the frozen path sees none of it)."""
    targets: Annotated[list[str], Rule(_module_names, "must be distinct module names (e.g. qkv, attn.proj)",
                                       "e.g. --set {where}.targets=qkv,proj")] = field(default_factory=list)
    """Linear layers adapted, by the end of their module name in the backbone (qkv matches blocks.0.attn.qkv); empty =
    the Linear layers of the family's self-attention (its query/key/value and output projections)."""


def _distinct_positive(values, _) -> bool:
    return all(v > 0 for v in values) and len(set(values)) == len(values)


@dataclass
class FinetuneGridConfig:
    """finetune's `grid` section: Devlin et al.'s finetuning protocol (2018, §A.3: lr ∈ {5e-5, 4e-5, 3e-5, 2e-5},
    epochs ∈ {2, 3, 4}, batch ∈ {16, 32}; random restarts on small data sets), every combination finetuned into
    OUT/grid/<lr>-<epochs>-<batch>-seed<k>/ and the best dev run kept as OUT. An empty list tries the one value
    of the train/optim section; a grid of one run is a plain finetune."""

    lr: Annotated[list[float], Axis("optim.lr"), Rule(_distinct_positive, "must be distinct learning rates > 0",
                                                      "e.g. --set {where}.lr=[5.0e-5,3.0e-5,2.0e-5]")] = field(default_factory=list)
    """Peak learning rates tried; empty = optim.lr alone."""
    epochs: Annotated[list[int], Axis("train.epochs"), Rule(_distinct_positive, "must be distinct epoch counts ≥ 1",
                                                            "e.g. --set {where}.epochs=[2,3,4]")] = field(default_factory=list)
    """Epoch counts tried; empty = train.epochs alone."""
    batch_size: Annotated[list[int], Axis("train.global_batch_size"),
                          Rule(_distinct_positive, "must be distinct batch sizes ≥ 1",
                               "e.g. --set {where}.batch_size=[16,32]")] = field(default_factory=list)
    """Batch sizes tried; empty = train.batch_size alone."""
    seeds: Size = 1
    """Runs of each setting, seeded train.seed, train.seed + 1, …: the best dev run of all is kept."""
