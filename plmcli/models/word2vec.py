"""word2vec (Mikolov et al. 2013a, 2013b): skip-gram and CBOW with negative sampling, the step between the
feed-forward NNLM and ELMo. No perplexity (no distribution over the vocabulary): what it makes is static word
vectors, which `plm export --format word2vec` writes and `plm eval-vectors` scores on word analogies and
similarity. Trained by its own fit (`Fits`), not the loop: plain SGD over sparse rows, as the paper's code.

Conventions (those of word2vec.c, which gensim follows, so that both train on the same examples):
- the words are the tokenizer's tokens (recipes: the `word` tokenizer, whitespace-separated words); each line
  is a sentence and no window crosses one. Special tokens and words seen fewer than `min_count` times in the
  train split are dropped from the text before anything else (so the windows close over them);
- subsampling (2013b §2.3) keeps each occurrence of a word of corpus frequency f = c/T with probability
  min(1, (√(f/t) + 1)·t/f), drawn afresh each epoch (word2vec.c's form of the paper's 1 − √(t/f));
- each centre word takes a window of b ∈ 1..`window` words on each side, b uniform (2013a §3.2's "R");
- noise words are drawn from the unigram distribution raised to `ns_exponent` (3/4), a noise word equal to
  the target is skipped, and the loss of one example is
      −log σ(v'_O · h) − Σ_k log σ(−v'_k · h)     (2013b eq. 4)
  with h = v_I (skip-gram: the centre word predicts each context word) or the mean of the context words'
  v (CBOW predicts the centre word; as in word2vec.c, each context word then takes the whole error of h);
- the learning rate falls linearly from `alpha` to `min_alpha` over all epochs.

Trained by a compiled kernel (plmcli/kernels/word2vec.cpp, built on first use and cached; about 4× the words/s of the
torch path at one thread, and it scales with `workers`): word2vec.c's loop, one SGD step per example straight on
the float32 tables (a skip-gram pair the way word2vec.c and gensim compute it: the context word's v against the
centre's v', the same pairs), σ from word2vec.c's table (no update where |v'·h| ≥ 6, as gensim), the rate falling
with the words read (updated every 10,000 words), `workers` threads each taking the next ~10,000 words of
sentences (gensim's job queue: a thread slowed by other load takes fewer) and updating the shared tables without
locks (Hogwild!). One worker is deterministic (a seed gives the same bits); several are not, as in word2vec.c and gensim.
Where the kernel cannot run (PLM_CPU_KERNELS=0, no C++ compiler: a notice on stderr then says so), the torch
path trains: one epoch's examples are made chunk by chunk with numpy, then trained in batches of `batch_size`
examples — one gather, one dot product per target and one `index_add_` per table (Hogwild!-style, several updates
of one row in a batch add up); it uses torch's threads, not `workers`. The two paths draw differently, so a seed
gives other vectors on each (of the same quality). v (input_vectors) starts uniform in ±1/dim, as in gensim 4
(word2vec.c: ±0.5/dim, which left the kernel's CBOW 0.35 points of PTB analogies behind gensim over 4 seeds; at
±1/dim, 10 seeds: 3.60% vs gensim's 3.73%, WordSim ρ 0.226 vs 0.225), and v' (output_vectors) at zero. The exported vectors are v.

Transfer: `plm finetune` reads each token's v (`token_states`) and trains it with the task head. A vector has not
seen its neighbours, so the heads read them: sequence heads are Kim's (2014) CNN ("CNN-non-static": filters over
3, 4 and 5 words, 100 maps each, ReLU, max over the row, dropout 0.5, the output layer; `Traits.pooling` = cnn);
tagging is Collobert et al.'s (2011) window approach (`Traits.tag_window` = 2): the vectors of words i−2 … i+2,
each with its capitalization feature, through two hidden ReLU layers (`Traits.head_layers`; the letter case tells
the tagger what a rare or unknown word's [UNK] vector cannot).
Rows are framed as GPT's transfer frames them (`<s> a $ b <e>`), so a run finetunes when its tokenizer has a
bos or eos token (the word2vec recipes give both); the frame's tokens have no trained vector and learn one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
import torch
from torch import nn

from plmcli.config_schema import Count, NonNegative, OrAuto, Positive, Range, Rule, Size
from plmcli.errors import PlmError
from plmcli.kernels.switch import ENV
from plmcli.kernels.word2vec import word2vec_kernel
from plmcli.models.base import LanguageModel, Traits
from plmcli.models.layers import require_vocab

WEIGHTS = "model.safetensors"
CHUNK = 1 << 16
"""Kept words whose examples are made (and shuffled) at once: bounds memory, not results."""
GUIDE_PER_WORD = 8
"""NoiseTable's slices per word: ~7% of PTB's draws then fall in a slice that must be searched."""
GUIDE_MAX = 1 << 22
"""NoiseTable's most slices (32 MB): a vocabulary beyond 512k words searches more of its draws instead."""

BELOW_ALPHA = Rule(lambda v, c: v <= c["alpha"], "exceeds model.alpha {alpha}: the rate falls from alpha to min_alpha",
                   "pick {where}.min_alpha ≤ {where}.alpha, e.g. --set {where}.min_alpha=0.0001")


class NoiseTable:
    """Noise words by inversion of the cumulative distribution `cum` (float64, ascending to 1): a uniform u draws the
    first word whose cum exceeds u, `torch.searchsorted(cum, u, right=True)`, through a guide table (Chen & Asau
    1974) that gives the same words in O(1) for most draws.

    The binary search alone took 70 ns a draw over PTB's 10k words, 20% of a skip-gram epoch. The guide holds, for
    each of G equal slices [j/G, (j+1)/G) of [0, 1), the answer at the slice's start: a u whose slice holds no word's
    cum takes that answer; only the few in a slice where the answer changes are searched. The same draws as the
    search (tested), so a seed gives the same vectors as before. G (`slices`, a power of two so that u·G is exact):
    by default the least ≥ GUIDE_PER_WORD·V, at most GUIDE_MAX."""

    def __init__(self, cum: torch.Tensor, slices: int | None = None):
        self.cum = cum
        self.slices = slices or min(GUIDE_MAX, 1 << max(0, math.ceil(math.log2(GUIDE_PER_WORD * len(cum)))))
        if self.slices & (self.slices - 1):
            raise ValueError(f"slices must be a power of two, not {self.slices}")
        self.guide = torch.searchsorted(cum, torch.arange(self.slices + 1, dtype=cum.dtype) / self.slices, right=True)

    def draw(self, u: torch.Tensor) -> torch.Tensor:
        """The noise word of each uniform in `u` (any shape, float64 in [0, 1))."""
        flat = u.reshape(-1)
        j = (flat * self.slices).long()
        word = self.guide.index_select(0, j)  # index_select: advanced indexing is 2-5× slower here
        open_ = (word != self.guide[1:].index_select(0, j)).nonzero().squeeze(1)
        word.index_copy_(0, open_, torch.searchsorted(self.cum, flat.index_select(0, open_), right=True))
        return word.clamp_(max=len(self.cum) - 1).view(u.shape)


@dataclass
class Word2VecConfig:
    vocab_size: Count = 0
    """The tokenizer's size (0 = take it from the tokenizer): one vector per token; only the words seen ≥
    min_count times in the train split are trained and exported."""
    arch: Literal["skip-gram", "cbow"] = "skip-gram"
    """skip-gram (the centre word predicts each context word) | cbow (the mean of the context predicts the centre)."""
    dim: Size = 100
    """Vector size."""
    window: Size = 5
    """Largest number of words on each side of the centre; each centre draws its own 1..window."""
    negative: Size = 5
    """Noise words per example (k of negative sampling)."""
    ns_exponent: NonNegative = 0.75
    """Noise distribution ∝ count^ns_exponent (3/4 in the paper; 1 = unigram, 0 = uniform)."""
    sample: NonNegative = 1e-3
    """Subsampling threshold t of frequent words (0 = keep every word)."""
    alpha: Positive = 0.025
    """Starting learning rate (word2vec.c: 0.025 for skip-gram, 0.05 for CBOW)."""
    min_alpha: Annotated[float, Range(0), BELOW_ALPHA] = 1e-4
    """Learning rate at the end of the last epoch; it falls linearly from alpha."""
    epochs: Size = 5
    """Passes over the train split."""
    min_count: Size = 5
    """Words seen fewer times than this in the train split get no vector and are dropped from the text."""
    batch_size: Size = 512
    """Examples per update of the torch path (where the compiled kernel cannot run): (centre, context) pairs for
    skip-gram, centre words for CBOW. The kernel updates after every example, as word2vec.c."""
    workers: Annotated[Union[int, str], OrAuto(Range(1))] = 1
    """Threads of the compiled trainer (Hogwild!: each takes the next ~10,000 words of sentences, all update the
    same vectors without locks), or auto: one per CPU core this process may run on. 1 is deterministic (a seed gives
    the same vectors bit for bit); more are faster and not deterministic, as word2vec.c's and gensim's threads.
    The torch path (PLM_CPU_KERNELS=0, no compiler) ignores it."""


class Word2Vec(LanguageModel):
    """Input vectors v and output vectors v' per token; `fit` trains them, `word_vectors` gives the trained ones."""

    # Neither causal nor an encoder, and no distribution over words: eval-ppl and generate refuse it.
    # Finetuned: Kim's CNN over its vectors — on 1,000 labelled rows 1.3 (SST-2) and 0.7 (ChnSentiCorp) points above
    # Iyyer et al.'s deep averaging network (their mean under two hidden layers), and 6.3 points above its own random
    # init on ChnSentiCorp where the averaging network's gain stayed at 3.1 (BENCHMARKS: low-resource).
    traits = Traits(pair_layout="causal", pooling="cnn", head_layers=2, tag_window=2)
    Config = Word2VecConfig
    tiny = ("model.dim=8", "model.epochs=1", "model.min_count=1", "model.vocab_size=50")  # SGD: well under a second

    def __init__(self, cfg: Word2VecConfig):
        super().__init__()
        require_vocab(cfg)
        self.cfg = cfg
        V, D = cfg.vocab_size, cfg.dim
        self.input_vectors = nn.Parameter(nn.init.uniform_(torch.empty(V, D), -1.0 / D, 1.0 / D), requires_grad=False)
        self.output_vectors = nn.Parameter(torch.zeros(V, D), requires_grad=False)
        # the train-split count of each token with a vector; 0 for the rest (specials, rare words)
        self.register_buffer("counts", torch.zeros(V, dtype=torch.int64))

    def forward(self, input_ids):
        """The word vectors v of `input_ids`."""
        return self.input_vectors[input_ids]

    def embedding_tables(self) -> list[nn.Parameter]:
        return [self.input_vectors, self.output_vectors]

    def token_states(self, input_ids, attention_mask=None):
        """Each token's vector v (B, T, dim) for a task head: a static vector reads no neighbour, so padding never
        reaches a real position."""
        return nn.functional.embedding(input_ids, self.input_vectors)

    # ------------------------------------------------------------ vocabulary and noise

    def count_words(self, ids: np.ndarray, skip=()) -> np.ndarray:
        """Set `counts` from the training ids: tokens in `skip` (specials) and rarer than min_count get 0."""
        V = self.cfg.vocab_size
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= V):
            raise PlmError(f"token ids reach {int(ids.max())} but model.vocab_size is {V}",
                           "leave model.vocab_size at 0 so that it follows the tokenizer")
        counts = np.bincount(ids, minlength=V)
        counts[np.asarray(list(skip), dtype=np.int64)] = 0
        counts[counts < self.cfg.min_count] = 0
        self.counts.copy_(torch.from_numpy(counts))
        return counts

    def keep_probability(self, counts: np.ndarray) -> np.ndarray:
        """P(an occurrence is kept) per token: 0 without a vector; word2vec.c's subsampling otherwise."""
        c = counts.astype(np.float64)
        p = (c > 0).astype(np.float64)
        if self.cfg.sample > 0:
            threshold = self.cfg.sample * c.sum()  # t·T: f/t = c/(t·T)
            seen = c > 0
            p[seen] = np.minimum(1.0, (np.sqrt(c[seen] / threshold) + 1) * threshold / c[seen])
        return p

    def noise_table(self, counts: np.ndarray) -> NoiseTable:
        """The noise distribution ∝ count^ns_exponent (zero-count tokens are never drawn)."""
        w = np.where(counts > 0, counts.astype(np.float64) ** self.cfg.ns_exponent, 0.0)
        cum = np.cumsum(w)
        return NoiseTable(torch.from_numpy(cum / cum[-1]))

    # ------------------------------------------------------------ training

    def train_ids(self, ids, lengths, skip=(), seed: int = 0, console=None) -> dict:
        """Train on sentences given as token ids (`lengths` words each); `skip`: ids that are no words (specials)."""
        ids, lengths = np.asarray(ids, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
        counts = self.count_words(ids, skip)
        if not counts.any():
            raise PlmError(f"no word of the train split is seen ≥ model.min_count = {self.cfg.min_count} times",
                           "use more text, or lower it, e.g. --set model.min_count=1")
        in_vocab = counts[ids] > 0
        raw_words = int(in_vocab.sum())
        sentence = np.repeat(np.arange(len(lengths)), lengths)[in_vocab]
        words = ids[in_vocab]
        keep, noise = self.keep_probability(counts), self.noise_table(counts)
        kernel = word2vec_kernel() if self.input_vectors.device.type == "cpu" else None
        started = time.perf_counter()
        if kernel is not None:
            per_epoch = self._kernel_epochs(kernel, words, sentence, len(lengths), keep, noise, seed)
        else:
            per_epoch = self._torch_epochs(words, sentence, keep, noise, seed, console)
        train_s = time.perf_counter() - started
        losses = [loss / max(n, 1) for loss, n in per_epoch]
        if kernel is not None and console is not None:
            for epoch, (loss, (_, n)) in enumerate(zip(losses, per_epoch)):
                console.print(f"word2vec epoch {epoch + 1}/{self.cfg.epochs}: loss {loss:.4f} over {n:,} examples")
        return {"steps": 0, "epochs": self.cfg.epochs, "words": raw_words, "sentences": int(len(lengths)),
                "vocab": int((counts > 0).sum()), "examples": sum(n for _, n in per_epoch), "loss": losses[-1],
                "epoch_loss": losses, "train_s": round(train_s, 3),
                "words_per_s": raw_words * self.cfg.epochs / max(train_s, 1e-9), "stop_reason": "fit",
                "trainer": "kernel" if kernel is not None else "torch",
                "workers": self.resolved_workers() if kernel is not None else 1}

    def resolved_workers(self) -> int:
        """model.workers as a count: auto is the CPU cores this process may run on."""
        from plmcli.data.batching import available_cores

        return int(self.cfg.workers) if self.cfg.workers != "auto" else available_cores()

    def _kernel_epochs(self, kernel, words, sentence, n_sentences: int, keep, noise, seed: int) -> list[tuple[float, int]]:
        """All epochs in the compiled trainer: (summed loss, examples) per epoch."""
        per_sentence = np.bincount(sentence, minlength=n_sentences)
        starts = np.concatenate([[0], np.cumsum(per_sentence[per_sentence > 0])]).astype(np.int64)
        for table in (self.input_vectors, self.output_vectors):
            if not table.data.is_contiguous() or table.dtype != torch.float32:
                raise PlmError("word2vec's vector tables must be contiguous float32 to train in place",
                               f"set {ENV}=0 to train with torch ops")
        result = kernel.train(self.input_vectors.data, self.output_vectors.data,
                              torch.from_numpy(words.astype(np.int32)), torch.from_numpy(starts),
                              torch.from_numpy(keep.astype(np.float64)), noise.cum.to(torch.float64).contiguous(),
                              noise.guide.to(torch.int64).contiguous(), self.cfg.arch == "cbow", self.cfg.window,
                              self.cfg.negative, float(self.cfg.alpha), float(self.cfg.min_alpha), self.cfg.epochs,
                              self.resolved_workers(), int(seed))
        return [(float(loss), int(n)) for loss, n in result.tolist()]

    def _torch_epochs(self, words, sentence, keep, noise, seed: int, console) -> list[tuple[float, int]]:
        """All epochs with torch ops, batch by batch (the path where the kernel cannot run)."""
        rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)
        per_epoch = []
        for epoch in range(self.cfg.epochs):
            kept = rng.random(len(words)) < keep[words]
            loss, n = self._epoch(words[kept], sentence[kept], noise, epoch, rng, gen)
            per_epoch.append((loss, n))
            if console is not None:
                console.print(f"word2vec epoch {epoch + 1}/{self.cfg.epochs}: loss {loss / max(n, 1):.4f} over {n:,} examples")
        return per_epoch

    def _epoch(self, words: np.ndarray, sentence: np.ndarray, noise, epoch: int, rng, gen) -> tuple[float, int]:
        """One pass over the kept words: (summed loss, examples)."""
        M, total, n_done = len(words), 0.0, 0
        step = self._sg_step if self.cfg.arch == "skip-gram" else self._cbow_step
        for a in range(0, M, CHUNK):
            b = min(a + CHUNK, M)
            examples = self._examples(words, sentence, a, b, rng)
            n = len(examples[0])
            negs = noise.draw(torch.rand(n, self.cfg.negative, generator=gen, dtype=torch.float64))
            B = self.cfg.batch_size
            for s in range(0, n, B):
                progress = (epoch + (a + (b - a) * s / n) / M) / self.cfg.epochs
                alpha = self.cfg.alpha - (self.cfg.alpha - self.cfg.min_alpha) * progress
                total += step(*(x[s:s + B] for x in examples), negs[s:s + B], alpha)
            n_done += n
        return total, n_done

    def _examples(self, words: np.ndarray, sentence: np.ndarray, a: int, b: int, rng) -> tuple:
        """The examples of the centres a..b-1 of the kept words, in random order: skip-gram (centre word,
        context word) pairs; CBOW (centre word, (n, 2·window) context words, their mask)."""
        W, M = self.cfg.window, len(words)
        pos = np.arange(a, b)[:, None]
        offsets = np.array([*range(-W, 0), *range(1, W + 1)])
        j = pos + offsets  # (b - a, 2W) context positions
        reach = W - rng.integers(0, W, (b - a, 1))  # word2vec.c: window - b, b uniform in 0..window-1
        ok = (np.abs(offsets) <= reach) & (j >= 0) & (j < M)
        j = np.clip(j, 0, M - 1)
        ok &= sentence[j] == sentence[pos]  # no window crosses a sentence
        if self.cfg.arch == "skip-gram":
            centre, slot = np.nonzero(ok)
            order = rng.permutation(len(centre))
            return torch.from_numpy(words[a + centre[order]]), torch.from_numpy(words[j[centre, slot][order]])
        has = np.flatnonzero(ok.any(1))  # a word alone in its sentence has no context: no example
        order = has[rng.permutation(len(has))]
        return (torch.from_numpy(words[a + order]), torch.from_numpy(words[j[order]]), torch.from_numpy(ok[order]))

    def _update(self, h: torch.Tensor, target: torch.Tensor, negs: torch.Tensor, alpha: float):
        """Negative sampling for hidden vectors h (B, D) predicting `target`: updates v' in place; returns the
        error to add to h's input vectors (B, D) and the summed loss."""
        B, D = h.shape
        rows = torch.cat([target[:, None], negs], 1).view(-1)  # (B·(1 + k)): the target, then the noise words
        out = self.output_vectors.index_select(0, rows).view(B, -1, D)
        score = (out * h.unsqueeze(1)).sum(2)  # (B, 1 + k); elementwise beats bmm for these tiny products
        live = (negs != target[:, None]).to(h.dtype)  # word2vec.c skips noise equal to the target
        g = torch.sigmoid(score).mul_(-alpha)  # α(label − σ): label 1 for the target, 0 for noise
        g[:, 0] += alpha
        g[:, 1:] *= live
        err = torch.bmm(g.unsqueeze(1), out).squeeze(1)
        self.output_vectors.index_add_(0, rows, (g.unsqueeze(2) * h.unsqueeze(1)).view(-1, D))
        loss = nn.functional.logsigmoid(score[:, 0]).sum() + (nn.functional.logsigmoid(-score[:, 1:]) * live).sum()
        return err, -float(loss)

    def _sg_step(self, centre, context, negs, alpha: float) -> float:
        err, loss = self._update(self.input_vectors.index_select(0, centre), context, negs, alpha)
        self.input_vectors.index_add_(0, centre, err)
        return loss

    def _cbow_step(self, centre, ctx, mask, negs, alpha: float) -> float:
        B, W2 = ctx.shape
        # Only the present slots (about half of a window's 2·window: each centre draws its own reach) are read and
        # written: 1.3× the words/s of gathering, masking and scattering all of them (PTB, 1 thread).
        slot = mask.view(-1).nonzero().squeeze(1)
        example, word = slot // W2, ctx.view(-1).index_select(0, slot)
        h = self.input_vectors.new_zeros(B, self.cfg.dim).index_add_(0, example, self.input_vectors.index_select(0, word))
        h /= mask.sum(1, dtype=h.dtype)[:, None]
        err, loss = self._update(h, centre, negs, alpha)
        # word2vec.c (and gensim's cbow_mean) give every context word the whole error, not error / count
        self.input_vectors.index_add_(0, word, err.index_select(0, example))
        return loss

    # ------------------------------------------------------------ fit / vectors

    def fit(self, data_dir, recipe, run_dir, console=None) -> dict:
        """Train on the train split of a `plm tokenize` dir (each line a sentence) and write RUN/model.safetensors."""
        from plmcli.data.store import load_meta
        from plmcli.models.ngram import read_sentences

        started = time.monotonic()
        ids, lengths = read_sentences(data_dir, "train")
        if len(lengths) == 0:
            raise PlmError(f"the train split of {data_dir} has no sentences", "add text (one sentence per line)")
        specials = load_meta(data_dir)["tokenizer"]["special_token_ids"].values()
        with torch.no_grad():
            summary = self.train_ids(ids, lengths, skip=set(specials), seed=recipe.train.seed, console=console)
        self.save(run_dir)
        summary["tokens"] = int(lengths.sum())
        summary["elapsed_s"] = time.monotonic() - started
        if console is not None:
            console.print(f"word2vec ({self.cfg.arch}): {summary['vocab']:,} words × {self.cfg.dim}, "
                          f"{summary['words']:,} words × {self.cfg.epochs} epochs in {summary['train_s']:.1f}s "
                          f"({summary['words_per_s']:,.0f} words/s)")
        return summary

    def save(self, run_dir) -> Path:
        from safetensors.torch import save_model

        from plmcli.data.store import atomic_path

        path = Path(run_dir) / WEIGHTS
        with atomic_path(path, path.with_name(f".{path.name}.tmp")) as tmp:
            save_model(self, str(tmp))
        return path

    def word_vectors(self, token_strings: list[str]) -> tuple[list[str], np.ndarray]:
        """The trained words (most frequent first, ties by id) and their vectors v, (n, dim) float32."""
        counts = self.counts.cpu().numpy()
        rows = np.flatnonzero(counts > 0)
        rows = rows[np.argsort(-counts[rows], kind="stable")]
        return [token_strings[i] for i in rows], self.input_vectors.detach().cpu().numpy()[rows].astype(np.float32)
