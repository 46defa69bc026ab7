// word2vec's trainer (skip-gram and CBOW with negative sampling) as word2vec.c and gensim train it: one SGD step
// per (centre, context) pair straight on the float32 tables, sigmoid from word2vec.c's table (1,000 steps over
// [-6, 6]; a dot product beyond updates nothing, as in gensim), the rate falling linearly with the words read (the shared
// count updated every 10,000 words of a thread), a fresh subsampling draw per occurrence and epoch, a reach of
// window − b (b uniform in 0..window−1) per centre, noise words from the caller's cumulative distribution through
// its guide table (plmcli/models/word2vec.py's NoiseTable: the same words as a binary search).
// Threads (Hogwild!): each takes the next job (an epoch's run of sentences of ~10,000 words) until all epochs are
// done, updating the shared tables without locks; one thread is deterministic (the same seed gives the same bits,
// reading the corpus in order epoch after epoch), several are not.
// Loaded by plmcli/kernels/word2vec.py (torch.utils.cpp_extension.load_inline, which adds torch/extension.h).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace {

constexpr int EXP_TABLE_SIZE = 1000;
constexpr float MAX_EXP = 6.0f;
constexpr int64_t REPORT_EVERY = 10000;  // words a thread reads between updates of the shared count (word2vec.c)
constexpr int64_t JOB_WORDS = 10000;     // words per job a thread takes (gensim's batch_words)

struct Job {
  float* in;            // (V, stride) input vectors v, the first D floats of each row
  float* out;           // (V, stride) output vectors v'
  int64_t dim;
  int64_t stride;       // floats from one row to the next: D rounded up to whole cache lines
  const int32_t* words;   // the corpus' words with a vector, sentence after sentence
  const int64_t* starts;  // (S + 1) offsets of the sentences in `words`
  const double* keep;     // (V) probability that an occurrence is kept (subsampling)
  const double* cum;      // (V) noise distribution, cumulative, ascending to 1
  const int64_t* guide;   // (slices + 1) the first word whose cum exceeds j / slices
  int64_t vocab, slices;
  bool cbow;
  int window, negative, epochs;
  double alpha, min_alpha;
  int64_t total_words;    // words × epochs: the rate reaches min_alpha there
  std::atomic<int64_t>* done;
  std::atomic<int64_t>* next_job;
  std::vector<int64_t> chunks;  // the jobs' first sentences, then S
  float sig[EXP_TABLE_SIZE + 1];
  float log_sig[EXP_TABLE_SIZE + 1];      // log σ(x)
  float log_one_minus[EXP_TABLE_SIZE + 1];  // log(1 − σ(x))
};

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline double uniform(uint64_t& s) { return static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53; }

inline int64_t noise_word(const Job& j, uint64_t& rng) {
  const double u = uniform(rng);
  const int64_t slice = static_cast<int64_t>(u * static_cast<double>(j.slices));
  int64_t lo = j.guide[slice];
  const int64_t hi = j.guide[slice + 1];
  if (lo != hi) {  // the answer changes inside this slice: the first cum > u in [lo, hi]
    lo = std::upper_bound(j.cum + lo, j.cum + hi, u) - j.cum;
  }
  return std::min(lo, j.vocab - 1);
}

// h predicts `target` against `negative` noise words: v' rows updated, the error of h added to `err`; the loss.
// `rows`: room for negative + 1 words. The noise words are drawn first, so that their rows are fetched while the
// first ones are computed.
inline double negative_sampling(const Job& j, const float* __restrict__ h, float* __restrict__ err, int64_t target,
                                float alpha, uint64_t& rng, int64_t* rows) {
  const int64_t D = j.dim, S = j.stride;
  int n = 0;
  rows[n++] = target;
  for (int d = 0; d < j.negative; ++d) {
    const int64_t word = noise_word(j, rng);
    if (word == target) continue;  // word2vec.c skips a noise word equal to the target
    rows[n++] = word;
    __builtin_prefetch(j.out + word * S);
    __builtin_prefetch(j.out + word * S + 32);
    __builtin_prefetch(j.out + word * S + 64);
  }
  double loss = 0.0;
  for (int d = 0; d < n; ++d) {
    const float label = d == 0 ? 1.0f : 0.0f;
    float* __restrict__ o = j.out + rows[d] * S;
    float f = 0.0f;
    for (int64_t k = 0; k < D; ++k) f += h[k] * o[k];
    if (f >= MAX_EXP || f <= -MAX_EXP) {  // saturated: no update (gensim's rule)
      loss += d == 0 ? std::max(0.0f, -f) : std::max(0.0f, f);
      continue;
    }
    const int i = static_cast<int>((f + MAX_EXP) * (EXP_TABLE_SIZE / MAX_EXP / 2));
    const float g = (label - j.sig[i]) * alpha;
    loss -= d == 0 ? j.log_sig[i] : j.log_one_minus[i];
    for (int64_t k = 0; k < D; ++k) {
      err[k] += g * o[k];
      o[k] += g * h[k];
    }
  }
  return loss;
}

// One thread's sums per epoch, on cache lines of its own: the threads' tallies were small heap blocks side by side,
// and skip-gram's per-pair additions to them made the cores fight over one line (2 workers slower than 1).
struct alignas(64) Tally {
  std::vector<double> loss, examples;
  char pad[64];
};

// One sentence's kept words `sen`: every centre's examples. Adds to the tally of `epoch`.
void train_sentence(const Job& j, const std::vector<int32_t>& sen, float alpha, uint64_t& rng, std::vector<float>& h,
                    std::vector<float>& err, std::vector<int64_t>& rows, double& loss, double& examples) {
  const int64_t n = static_cast<int64_t>(sen.size());
  const int64_t D = j.dim, S = j.stride;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t reach = j.window - static_cast<int64_t>(splitmix64(rng) % static_cast<uint64_t>(j.window));
    const int64_t a = std::max<int64_t>(0, i - reach), b = std::min<int64_t>(n - 1, i + reach);
    if (j.cbow) {
      if (a == b) continue;  // alone in its sentence: no context, no example
      std::fill(h.begin(), h.end(), 0.0f);
      std::fill(err.begin(), err.end(), 0.0f);
      for (int64_t c = a; c <= b; ++c) {
        if (c == i) continue;
        const float* v = j.in + static_cast<int64_t>(sen[c]) * S;
        for (int64_t k = 0; k < D; ++k) h[k] += v[k];
      }
      const float scale = 1.0f / static_cast<float>(b - a);
      for (int64_t k = 0; k < D; ++k) h[k] *= scale;
      loss += negative_sampling(j, h.data(), err.data(), sen[i], alpha, rng, rows.data());
      examples += 1;
      for (int64_t c = a; c <= b; ++c) {  // each context word takes the whole error (cbow_mean)
        if (c == i) continue;
        float* v = j.in + static_cast<int64_t>(sen[c]) * S;
        for (int64_t k = 0; k < D; ++k) v[k] += err[k];
      }
    } else {
      for (int64_t c = a; c <= b; ++c) {  // each (centre, context) pair: as word2vec.c and gensim, the context
        if (c == i) continue;               // word's v is h and the centre's v' the target (the same pairs)
        float* v = j.in + static_cast<int64_t>(sen[c]) * S;
        std::fill(err.begin(), err.end(), 0.0f);
        loss += negative_sampling(j, v, err.data(), sen[i], alpha, rng, rows.data());
        examples += 1;
        for (int64_t k = 0; k < D; ++k) v[k] += err[k];
      }
    }
  }
}

// Takes jobs (an epoch's run of sentences, ~JOB_WORDS words) in order from the shared counter until none is left:
// a thread slowed by other load takes fewer jobs instead of holding the others up (gensim's job queue).
void train_thread(const Job& j, uint64_t seed, Tally& tally) {
  uint64_t rng = seed;
  std::vector<float> h(j.dim), err(j.dim);
  std::vector<int64_t> rows(j.negative + 1);
  std::vector<int32_t> sen;
  int64_t unreported = 0;
  float alpha = static_cast<float>(j.alpha);
  const int64_t n_chunks = static_cast<int64_t>(j.chunks.size()) - 1;
  for (int64_t job = j.next_job->fetch_add(1); job < n_chunks * j.epochs; job = j.next_job->fetch_add(1)) {
    const int64_t epoch = job / n_chunks, chunk = job % n_chunks;
    double loss = 0.0, examples = 0.0;  // in registers while the job runs: added to the tally once, at its end
    for (int64_t s = j.chunks[chunk]; s < j.chunks[chunk + 1]; ++s) {
      sen.clear();
      for (int64_t p = j.starts[s]; p < j.starts[s + 1]; ++p) {
        const int32_t w = j.words[p];
        if (j.keep[w] >= 1.0 || uniform(rng) < j.keep[w]) sen.push_back(w);
      }
      train_sentence(j, sen, alpha, rng, h, err, rows, loss, examples);
      unreported += j.starts[s + 1] - j.starts[s];
      if (unreported >= REPORT_EVERY) {
        const int64_t done = j.done->fetch_add(unreported) + unreported;
        unreported = 0;
        const double progress = std::min(1.0, static_cast<double>(done) / static_cast<double>(j.total_words));
        alpha = static_cast<float>(j.alpha - (j.alpha - j.min_alpha) * progress);
      }
    }
    tally.loss[epoch] += loss;
    tally.examples[epoch] += examples;
  }
  j.done->fetch_add(unreported);
}

}  // namespace

// Trains in place; returns (epochs, 2) float64: each epoch's summed loss and its number of examples.
torch::Tensor train(torch::Tensor in, torch::Tensor out, torch::Tensor words, torch::Tensor starts, torch::Tensor keep,
                    torch::Tensor cum, torch::Tensor guide, bool cbow, int64_t window, int64_t negative,
                    double alpha, double min_alpha, int64_t epochs, int64_t workers, int64_t seed) {
  TORCH_CHECK(in.dtype() == torch::kFloat32 && out.dtype() == torch::kFloat32 && in.is_contiguous() &&
              out.is_contiguous() && in.sizes() == out.sizes(), "the vector tables must be contiguous float32 alike");
  TORCH_CHECK(words.dtype() == torch::kInt32 && starts.dtype() == torch::kInt64 && keep.dtype() == torch::kFloat64 &&
              cum.dtype() == torch::kFloat64 && guide.dtype() == torch::kInt64, "word2vec kernel: wrong dtypes");
  TORCH_CHECK(window >= 1 && negative >= 0 && epochs >= 1 && workers >= 1, "word2vec kernel: bad settings");
  auto job = std::make_unique<Job>();
  Job& j = *job;
  // Rows padded to whole 64-byte lines (torch's CPU allocations start on one), so every row's loops start on a line:
  // one worker's skip-gram on PTB went from 0.93M to 1.06M words/s (D = 100, rows of 400 bytes before).
  const int64_t D = in.size(1), stride = (D + 15) / 16 * 16;
  torch::Tensor pin = in, pout = out;
  if (stride != D) {
    pin = torch::zeros({in.size(0), stride}, in.options());
    pout = torch::zeros({out.size(0), stride}, out.options());
    pin.narrow(1, 0, D).copy_(in);
    pout.narrow(1, 0, D).copy_(out);
  }
  j.in = pin.data_ptr<float>();
  j.out = pout.data_ptr<float>();
  j.dim = D;
  j.stride = stride;
  j.words = words.data_ptr<int32_t>();
  j.starts = starts.data_ptr<int64_t>();
  j.keep = keep.data_ptr<double>();
  j.cum = cum.data_ptr<double>();
  j.guide = guide.data_ptr<int64_t>();
  j.vocab = cum.size(0);
  j.slices = guide.size(0) - 1;
  j.cbow = cbow;
  j.window = static_cast<int>(window);
  j.negative = static_cast<int>(negative);
  j.epochs = static_cast<int>(epochs);
  j.alpha = alpha;
  j.min_alpha = min_alpha;
  const int64_t S = starts.size(0) - 1;
  const int64_t N = S > 0 ? j.starts[S] : 0;
  j.total_words = std::max<int64_t>(1, N * epochs);
  std::atomic<int64_t> done{0};
  j.done = &done;
  for (int i = 0; i <= EXP_TABLE_SIZE; ++i) {
    const double x = (static_cast<double>(i) / EXP_TABLE_SIZE * 2 - 1) * MAX_EXP;
    const double e = std::exp(x);
    j.sig[i] = static_cast<float>(e / (e + 1));
    j.log_sig[i] = static_cast<float>(-std::log1p(std::exp(-x)));
    j.log_one_minus[i] = static_cast<float>(-std::log1p(e));
  }
  for (int64_t s = 0; s < S; ++s) {  // jobs: runs of whole sentences of ~JOB_WORDS words
    if (s == 0 || j.starts[s] - j.starts[j.chunks.back()] >= JOB_WORDS) j.chunks.push_back(s);
  }
  j.chunks.push_back(S);
  std::atomic<int64_t> next_job{0};
  j.next_job = &next_job;
  std::vector<Tally> tallies(workers);
  {
    pybind11::gil_scoped_release release;
    std::vector<std::thread> threads;
    for (int64_t t = 0; t < workers; ++t) {
      tallies[t].loss.assign(epochs, 0.0);
      tallies[t].examples.assign(epochs, 0.0);
      uint64_t state = static_cast<uint64_t>(seed) * 0x2545F4914F6CDD1DULL + static_cast<uint64_t>(t) + 1;
      const uint64_t thread_seed = splitmix64(state);
      if (workers == 1) {
        train_thread(j, thread_seed, tallies[t]);
      } else {
        threads.emplace_back(train_thread, std::cref(j), thread_seed, std::ref(tallies[t]));
      }
    }
    for (auto& th : threads) th.join();
  }
  if (stride != D) {
    in.copy_(pin.narrow(1, 0, D));
    out.copy_(pout.narrow(1, 0, D));
  }
  auto result = torch::zeros({epochs, 2}, torch::kFloat64);
  auto r = result.accessor<double, 2>();
  for (const auto& t : tallies) {
    for (int64_t e = 0; e < epochs; ++e) {
      r[e][0] += t.loss[e];
      r[e][1] += t.examples[e];
    }
  }
  return result;
}
