// kiln/data/text.hpp — character-level text for language models: a tokenizer built from the text,
// a train / validation split, and nanoGPT's get_batch (random windows of T + 1 tokens).
//
//   const std::string text = kiln::data::read_text("data/tinyshakespeare.txt.gz");
//   const auto tok = kiln::data::CharTokenizer::from_text(text);       // 65 characters, sorted
//   auto [train, val] = kiln::data::split_tokens(tok.encode(text), 0.9);
//   kiln::data::TokenWindows windows(train, 64, "tinyshakespeare (train)");
//   windows.sample(12, gen, features, labels);   // [12, 64] ids as float, 12 * 64 next-token labels
//
// Characters are bytes (ASCII text: the characters themselves; a UTF-8 character beyond ASCII is
// as many tokens as it has bytes). The vocabulary is the sorted set of bytes in the text, as
// nanoGPT's prepare.py builds it, so ids are the same as its for an ASCII text. A window starts at
// a uniform position in [0, n - T - 1] (torch.randint(len(data) - block_size)), drawn from the
// caller's generator: the same seed gives the same batches.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/random.hpp"
#include "kiln/data/file.hpp"

namespace kiln::data {

// The bytes of a text file (gzip or plain).
inline std::string read_text(const std::filesystem::path& path) {
  const std::vector<std::uint8_t> bytes = read_file(path);
  return std::string(bytes.begin(), bytes.end());
}

// A printable form of one byte for error messages: 'a', '\n', or \xNN.
inline std::string describe_char(unsigned char c) {
  if (c == '\n') return "'\\n'";
  if (c == '\t') return "'\\t'";
  if (c >= 32 && c < 127) return std::string("'") + char(c) + "'";
  static const char* hex = "0123456789abcdef";
  return std::string("\\x") + hex[c >> 4] + hex[c & 15];
}

class CharTokenizer {
 public:
  // The vocabulary of `text`: its distinct bytes, sorted.
  // throws: ValueError for an empty text.
  static CharTokenizer from_text(std::string_view text) {
    KILN_CHECK(!text.empty(), ValueError, "CharTokenizer::from_text: the text is empty; there is no vocabulary");
    std::array<bool, 256> seen{};
    for (char c : text) seen[static_cast<unsigned char>(c)] = true;
    CharTokenizer t;
    for (int c = 0; c < 256; ++c)
      if (seen[std::size_t(c)]) t.chars_.push_back(char(c));
    t.index_.fill(-1);
    for (std::size_t i = 0; i < t.chars_.size(); ++i) t.index_[static_cast<unsigned char>(t.chars_[i])] = int(i);
    return t;
  }

  index_t size() const { return index_t(chars_.size()); }
  // The vocabulary in id order.
  const std::string& chars() const { return chars_; }

  // throws: ValueError naming the first character outside the vocabulary and its position.
  std::vector<std::int32_t> encode(std::string_view s) const {
    std::vector<std::int32_t> out(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      const int id = index_[static_cast<unsigned char>(s[i])];
      KILN_CHECK(id >= 0, ValueError, "CharTokenizer::encode: the character ",
                 describe_char(static_cast<unsigned char>(s[i])), " at position ", i,
                 " is not in the vocabulary of ", chars_.size(), " characters");
      out[i] = std::int32_t(id);
    }
    return out;
  }
  // throws: ValueError for an id outside [0, size()).
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string out(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) {
      KILN_CHECK(ids[i] >= 0 && index_t(ids[i]) < size(), ValueError, "CharTokenizer::decode: id ", ids[i],
                 " at position ", i, " is outside the vocabulary [0, ", size(), ")");
      out[i] = chars_[std::size_t(ids[i])];
    }
    return out;
  }

 private:
  std::string chars_;
  std::array<int, 256> index_{};
};

// The first train_fraction of the tokens, and the rest (nanoGPT's n = int(0.9 * len(data))).
inline std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> split_tokens(const std::vector<std::int32_t>& tokens,
                                                                                      double train_fraction = 0.9) {
  KILN_CHECK(train_fraction > 0.0 && train_fraction < 1.0, ValueError, "split_tokens: train_fraction must be in (0, 1), got ",
             train_fraction);
  const auto n = std::size_t(double(tokens.size()) * train_fraction);
  return {std::vector<std::int32_t>(tokens.begin(), tokens.begin() + std::ptrdiff_t(n)),
          std::vector<std::int32_t>(tokens.begin() + std::ptrdiff_t(n), tokens.end())};
}

// Random windows of length + 1 tokens: inputs the first `length`, labels the `length` after each.
class TokenWindows {
 public:
  // throws: ValueError when the tokens cannot hold one window of length + 1 (naming `source`).
  TokenWindows(std::vector<std::int32_t> tokens, index_t length, std::string source)
      : tokens_(std::move(tokens)), length_(length), source_(std::move(source)) {
    KILN_CHECK(length_ >= 1, ValueError, "TokenWindows: the window length must be >= 1, got ", length_);
    KILN_CHECK(index_t(tokens_.size()) >= length_ + 1, ValueError, "TokenWindows: ", source_, " has ", tokens_.size(),
               " tokens, too few for one window of T + 1 = ", length_ + 1);
  }

  index_t length() const { return length_; }
  index_t tokens() const { return index_t(tokens_.size()); }
  // The number of distinct windows (start positions).
  index_t starts() const { return index_t(tokens_.size()) - length_; }

  // `batch` windows from gen: features[b * T + t] = token (as float), labels[b * T + t] = the next one.
  void sample(index_t batch, Generator& gen, std::vector<float>& features, std::vector<std::int32_t>& labels) const {
    features.resize(std::size_t(batch * length_));
    labels.resize(std::size_t(batch * length_));
    for (index_t b = 0; b < batch; ++b) {
      const auto start = index_t(gen.below(std::uint64_t(starts())));
      for (index_t t = 0; t < length_; ++t) {
        features[std::size_t(b * length_ + t)] = float(tokens_[std::size_t(start + t)]);
        labels[std::size_t(b * length_ + t)] = tokens_[std::size_t(start + t + 1)];
      }
    }
  }

 private:
  std::vector<std::int32_t> tokens_;
  index_t length_;
  std::string source_;
};

}  // namespace kiln::data
