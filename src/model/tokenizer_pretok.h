// Regex pre-tokenizers for byte-level BPE: the text is cut into words by a
// sequence of regexes (each one splits every piece the previous ones left;
// both the matches and the text between them become pieces), and BPE merges
// never cross a word boundary. The sequence is chosen by tokenizer.ggml.pre.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ebb::tok {

class PreTokenizer {
 public:
  // Compiles (with JIT) the regexes of pre-tokenizer `name`. "" and
  // "default" select the GPT-2 regex, like "gpt-2" (the reference engine
  // instead uses a legacy split for them and warns). Throws ebb::Error
  // naming `name` (and listing the supported names) when it is unknown.
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // Splits `text` into consecutive pieces that together are `text`. Bytes
  // that are not valid UTF-8 become single-byte pieces of their own (the
  // regexes only ever see valid UTF-8).
  std::vector<std::string_view> split(std::string_view text) const;

  // Whether a whole word that is itself a token is emitted without merging
  // (Llama 3's tokenizer.json "ignore_merges").
  bool ignore_merges() const { return ignore_merges_; }
  const std::string& name() const { return name_; }

  // Every name the constructor accepts.
  static std::vector<std::string_view> supported_names();

 private:
  struct Regex;
  std::string name_;
  bool ignore_merges_ = false;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace ebb::tok
