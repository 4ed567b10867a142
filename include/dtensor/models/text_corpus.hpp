// dtensor/models/text_corpus.hpp — a character-level text corpus for a language model: the text
// read from files, its characters as ids 0..V-1 (sorted), split 90/10 into training and held-out
// text; k folds of it; [batch, seq] ids and next-character targets; a prompt encoded and ids
// decoded; and the batches a train::Trainer draws from it (train::FitData, with the data position
// for checkpoints). train_gpt's data, and any character model's.
//
//   const auto corpus = models::encode(models::read_text("input.txt"), /*seq=*/64);
//   std::mt19937_64 rng(seed);
//   auto data = models::text_batches(corpus, trainer, {.batch = 16, .seq = 64, .microbatches = 4}, rng);
//   train::fit(trainer, fit_options, data);
//
// No communication: every rank reads the same text and draws the same batches (the same seed);
// Trainer::microbatches keeps this rank's piece of each.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/core/tensor.hpp"
#include "dtensor/parallel/context_layout.hpp"
#include "dtensor/parallel/sync/data_split.hpp"
#include "dtensor/train/loop.hpp"

namespace dtensor::models {

/// The text of `file`, or with no file the files under /usr/share/common-licenses in name order
/// (the same text on every machine and rank). `what` names the source in errors (a flag: "--data").
inline std::string read_text(const std::string& file, const std::string& what = "the text") {
  std::string text;
  auto add = [&](const std::filesystem::path& p) {
    // An ifstream opens a directory and reads nothing: say so instead of training on no text.
    if (std::filesystem::is_directory(p))
      throw Error("models::read_text", what + " " + p.string() + " is a directory, not a text file");
    std::ifstream in(p, std::ios::binary);
    if (!in) throw Error("models::read_text", what + ": cannot read " + p.string());
    std::ostringstream s;
    s << in.rdbuf();
    text += s.str();
  };
  if (!file.empty()) {
    add(file);
    return text;
  }
  const std::filesystem::path dir = "/usr/share/common-licenses";
  if (!std::filesystem::is_directory(dir))
    throw Error("models::read_text", dir.string() + " not found: pass " + what + " FILE");
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) add(f);
  return text;
}

/// The characters of the text as ids 0..V-1 (sorted); the first 90% trains, the rest validates.
struct Corpus {
  std::vector<char> chars;
  std::vector<std::int32_t> train, val;
};

namespace detail {
inline std::uint64_t fnv1a_step(std::uint64_t h, std::uint64_t byte) { return (h ^ byte) * 1099511628211ull; }
}  // namespace detail

/// "65 characters, hash 1234...": the vocabulary itself (its characters, in id order), for a
/// checkpoint's configuration, so that a text of the same size but other characters is refused.
inline std::string vocabulary_id(const Corpus& c) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (char ch : c.chars) h = detail::fnv1a_step(h, std::uint8_t(ch));
  return std::to_string(c.chars.size()) + " characters, hash " + std::to_string(h);
}

/// The vocabulary and every token, as one line for the ranks' settings agreement: ranks that read
/// different texts (another file of the same name on another host) are found at setup.
inline std::string content_id(const Corpus& c) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a over the vocabulary and the tokens
  for (char ch : c.chars) h = detail::fnv1a_step(h, std::uint8_t(ch));
  for (const auto* part : {&c.train, &c.val})
    for (auto t : *part) h = detail::fnv1a_step(h, std::uint32_t(t));
  return std::to_string(c.chars.size()) + " characters, " + std::to_string(c.train.size() + c.val.size()) +
         " tokens, hash " + std::to_string(h);
}

/// The corpus of `text` for sequences of `seq` characters (each part must hold one and its target);
/// `names`: where the text and the length come from, for the error ({"--data", "--seq"}).
inline Corpus encode(const std::string& text, Extent seq,
                     const std::pair<std::string, std::string>& names = {"", "sequences of"}) {
  Corpus c;
  std::vector<int> id(256, -1);
  for (unsigned char ch : text) id[ch] = 0;
  for (int ch = 0; ch < 256; ++ch)
    if (id[std::size_t(ch)] == 0) {
      id[std::size_t(ch)] = int(c.chars.size());
      c.chars.push_back(char(ch));
    }
  const std::size_t split = text.size() * 9 / 10;
  for (std::size_t i = 0; i < text.size(); ++i)
    (i < split ? c.train : c.val).push_back(std::int32_t(id[static_cast<unsigned char>(text[i])]));
  if (c.train.size() <= std::size_t(seq) + 1 || c.val.size() <= std::size_t(seq) + 1)
    throw Error("models::encode", "the text (" + (names.first.empty() ? "" : names.first + ", ") +
                                      std::to_string(text.size()) + " characters) is too short for " + names.second +
                                      " " + std::to_string(seq));
  return c;
}

/// Fold f of k over the text's blocks (parallel::sync::kfold from `seed`, about 200 blocks of at
/// least 4 sequences): the other folds' blocks train, fold f's validate, each joined in order.
inline Corpus fold_of(const Corpus& whole, int k, int f, std::uint64_t seed, Extent seq) {
  std::vector<std::int32_t> all(whole.train);
  all.insert(all.end(), whole.val.begin(), whole.val.end());
  const std::size_t block = std::max<std::size_t>(4 * (std::size_t(seq) + 1), all.size() / 200);
  const std::size_t blocks = all.size() / block;  // the tail joins the last block
  const auto split = parallel::sync::kfold(blocks, std::size_t(k), seed).at(std::size_t(f));
  Corpus c{whole.chars, {}, {}};
  auto add = [&](std::vector<std::int32_t>& to, std::size_t b) {
    const std::size_t lo = b * block, hi = b + 1 == blocks ? all.size() : lo + block;
    to.insert(to.end(), all.begin() + std::ptrdiff_t(lo), all.begin() + std::ptrdiff_t(hi));
  };
  for (std::size_t b : split.train) add(c.train, b);
  for (std::size_t b : split.val) add(c.val, b);
  return c;
}

/// The [batch, seq] ids and targets (the next characters) of the sequences starting at `starts`.
inline std::pair<Tensor<std::int32_t, 2>, Tensor<std::int32_t, 2>> tokens_of(const std::vector<std::int32_t>& data,
                                                                             const std::vector<std::size_t>& starts,
                                                                             Extent seq) {
  const Shape<2> shape{Extent(starts.size()), seq};
  Tensor<std::int32_t, 2> ids(shape), tgt(shape);
  for (std::size_t b = 0; b < starts.size(); ++b)
    for (Extent t = 0; t < seq; ++t) {
      ids(Extent(b), t) = data[starts[b] + std::size_t(t)];
      tgt(Extent(b), t) = data[starts[b] + std::size_t(t) + 1];
    }
  return {std::move(ids), std::move(tgt)};
}

/// `text` as the corpus's ids; a character the corpus lacks is an error naming it (a UTF-8
/// character of several bytes whole, not its first byte). `what` names the text ("--prompt").
inline std::vector<std::int32_t> encode_prompt(const std::string& text, const Corpus& corpus,
                                               const std::string& what = "the prompt") {
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto at = std::find(corpus.chars.begin(), corpus.chars.end(), text[i]);
    if (at == corpus.chars.end()) {
      const auto lead = static_cast<unsigned char>(text[i]);
      const std::size_t n = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
      throw Error("models::encode_prompt",
                  what + ": the character '" + text.substr(i, n) + "'" +
                      (n > 1 ? " (" + std::to_string(n) + " bytes in UTF-8; the vocabulary is single bytes)" : "") +
                      " is not in the training text's " + std::to_string(corpus.chars.size()) + " characters");
    }
    ids.push_back(std::int32_t(at - corpus.chars.begin()));
  }
  return ids;
}

/// The characters of `ids`.
/// A model's vocabulary over the corpus: its alphabet, or `requested` rows (0: none requested) when
/// that is larger — ids past the alphabet are never drawn, their rows train toward low
/// probability (GPT-2's 50,257 rows for its head's and loss's cost: train_gpt --vocab).
inline Extent vocabulary_size(const Corpus& corpus, Extent requested) {
  const auto alphabet = Extent(corpus.chars.size());
  if (requested != 0 && requested < alphabet)
    throw Error(
        "models::vocabulary_size",
        dtensor::detail::cat("--vocab ", requested, " is below the text's alphabet of ", alphabet, " characters"));
  return std::max(alphabet, requested);
}

inline std::string decode(const std::vector<std::int32_t>& ids, const Corpus& corpus) {
  std::string text;
  for (std::int32_t id : ids) text += corpus.chars.at(std::size_t(id));
  return text;
}

/// --kfold k: k runs, one per fold (fold_of), `train_on(fold)` returning each one's validation
/// loss; `root` prints each fold's start and then the losses' mean and (sample) std.
template <class Fn>
void kfold_runs(const Corpus& corpus, int k, std::uint64_t seed, Extent seq, bool root, Fn&& train_on) {
  std::vector<double> val;
  for (int f = 0; f < k; ++f) {
    if (root) std::printf("--kfold %d: fold %d\n", k, f);
    val.push_back(train_on(fold_of(corpus, k, f, seed, seq)));
  }
  const auto [mean, sd] = parallel::sync::mean_std(val);
  if (root) std::printf("k-fold (k = %d): validation loss %.4f +- %.4f (mean +- std over folds)\n", k, mean, sd);
}

/// How text_batches draws a step's sequences.
struct TextBatchOptions {
  Extent batch = 1, seq = 1;  // sequences per step over all ranks, characters per sequence
  int microbatches = 1;       // the Trainer's
  int cp = 1;                 // context ranks: with load_balanced, the order ring attention stores
  bool load_balanced = false;
  int dp = 1;  // fedavg: one client per "dp" rank, each on its own slice of the text
  bool fedavg = false;
};

/// The batches: every rank draws the same `batch` sequences from `rng`, in the order the model
/// stores them (load-balanced over `cp`), cut into micro-batches; under FedAvg sequence b belongs to
/// client c (its micro-batch's rows split over "dp" first, as torch.chunk), which reads only its
/// own contiguous slice of the text: local, non-IID data. Validation: a fixed batch of the held-out
/// text. `rng` is the checkpoint's data state (state/restore); `corpus` and `rng` must outlive fit.
template <class Tr>
train::FitData<Tr> text_batches(const Corpus& corpus, Tr& trainer, const TextBatchOptions& o, std::mt19937_64& rng) {
  auto microbatches_of = [o, &trainer](const std::vector<std::int32_t>& data, const std::vector<std::size_t>& starts) {
    auto [ids, targets] = tokens_of(data, starts, o.seq);
    if (o.load_balanced && o.cp > 1)
      ids = parallel::load_balance(ids, 1, o.cp), targets = parallel::load_balance(targets, 1, o.cp);
    return trainer.microbatches(ids, targets);
  };
  train::FitData<Tr> data;
  data.batch = [o, &corpus, &rng, microbatches_of](int) {
    std::vector<std::size_t> starts(static_cast<std::size_t>(o.batch));
    const std::size_t span = corpus.train.size() - std::size_t(o.seq) - 1, dp = std::size_t(o.dp);
    const std::size_t mb = std::size_t(o.batch / o.microbatches), chunk = (mb + dp - 1) / dp;
    for (std::size_t b = 0; b < starts.size(); ++b) {
      const std::size_t c = (b % mb) / chunk, lo = o.fedavg ? span * c / dp : 0,
                        hi = o.fedavg ? span * (c + 1) / dp : span;
      starts[b] = lo + std::size_t(rng() % std::max<std::size_t>(1, hi - lo));
    }
    return microbatches_of(corpus.train, starts);
  };
  data.evaluate = [o, &corpus, &trainer, microbatches_of](int) {
    std::vector<std::size_t> starts(static_cast<std::size_t>(o.batch));
    for (std::size_t b = 0; b < starts.size(); ++b)
      starts[b] = (b * 7919u) % (corpus.val.size() - std::size_t(o.seq) - 1);
    return trainer.evaluate(microbatches_of(corpus.val, starts));
  };
  data.state = [&rng] {
    std::ostringstream state;
    state << rng;
    return state.str();
  };
  data.restore = [&rng](const std::string& state) {
    std::istringstream in(state);
    return bool(in >> rng);
  };
  return data;
}

}  // namespace dtensor::models
