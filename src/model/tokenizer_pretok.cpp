#include "model/tokenizer_pretok.h"

#include <pcre2.h>

#include <algorithm>

#include "model/tokenizer_unicode.h"
#include "platform/error.h"

namespace ebb::tok {

namespace {

// The regex sequences, written as in each model's tokenizer.json (the
// reference engine's copies, which rewrite some for std::regex, were checked
// against them). PCRE2 runs them in UTF + UCP mode, so \s, \p{L}, \p{N} and
// \p{P} have their Unicode meaning, as in the Hugging Face tokenizers that
// produced the golden vectors.

// GPT-2's regex: contractions, letter runs, digit runs and other-symbol runs
// each with an optional leading space, and whitespace not followed by text.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Llama 3 (cl100k-style): case-insensitive contractions, letters glued to one
// leading non-letter, digits in groups of up to three, newlines kept apart.
// The case-insensitivity is spelled out per letter so only ASCII folds.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: Llama 3's regex with single digits.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek LLM: newlines alone, then Latin/Greek/Cyrillic/... letter runs
// (an explicit list of ranges), ASCII and full-width punctuation runs,
// trailing whitespace, CJK runs, and digit runs. The letter class is the
// cased letters (Lu, Ll, Lt) of upstream's Unicode version, written with
// escapes because several of its characters (U+1F7D, U+1FBE, U+2126, U+212A,
// ...) have canonical equivalents that text tools silently normalise.
constexpr const char* kDeepseekLlmLetters =
    R"(\s?[)"
    R"(A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF})"
    R"(\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377})"
    R"(\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA})"
    R"(\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D})"
    R"(\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})"
    R"(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC})"
    R"(\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113})"
    R"(\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D})"
    R"(\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E})"
    R"(\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE})"
    R"(\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06})"
    R"(\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})"
    R"(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2})"
    R"(\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943})"
    R"(]+)";
constexpr const char* kCjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";  // [一-龥ࠀ-一가-퟿]+

// Falcon / StarCoder style: punctuation or digits split off first.
constexpr const char* kFalconPunct = R"([\p{P}\$\+<=>\^~\|`]+)";

// BLOOM family: runs of anything but whitespace and a few punctuation marks
// (the parentheses and '|' are literal members of the class, as upstream).
constexpr const char* kBloom = R"( ?[^(\s|.,!?…。，、।۔،)]+)";

// Mistral Tekken and GPT-4o: words split at lower->upper case changes.
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Spec {
  std::vector<std::string_view> names;
  bool ignore_merges;
  std::vector<const char*> regexes;
};

// Built on demand (a function, not a global table object).
std::vector<Spec> specs() {
  return {
      {{"", "default", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "jina-es", "jina-de",
        "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "gigachat", "roberta-bpe"},
       false,
       {kGpt2}},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "midm-2.0", "lfm2"}, true, {kLlama3}},
      {{"dbrx", "smaug-bpe", "chatglm-bpe"}, false, {kLlama3}},
      {{"qwen2", "stablelm2", "deepseek-r1-qwen", "hunyuan", "grok-2"}, false, {kQwen2}},
      {{"deepseek-llm"},
       false,
       {R"([\r\n])", kDeepseekLlmLetters, R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)", R"(\s+$)", kCjk,
        R"(\p{N}+)"}},
      {{"deepseek-coder"}, false, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}},
      {{"deepseek-v3", "hunyuan-dense"},
       false,
       {R"(\p{N}{1,3})", R"([一-龥぀-ゟ゠-ヿ]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"falcon"}, false, {kFalconPunct, kGpt2, R"([0-9][0-9][0-9])"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       false,
       {R"(\p{N})", kGpt2}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, false, {kBloom}},
      {{"viking"}, false, {kBloom, R"(\p{N})"}},
      {{"tekken"}, true, {kTekken}},
      {{"gpt-4o", "llama4"}, false, {kGpt4o}},
      {{"seed-coder"},
       false,
       {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"bailingmoe", "llada-moe"},
       false,
       {R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)"}},
  };
}

// A piece of text still to split (valid UTF-8) or kept whole (`raw`: a
// byte that is not valid UTF-8).
struct Piece {
  std::string_view text;
  bool raw;
};

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string_view name) : name_(name) {
  const std::vector<Spec> all = specs();
  const Spec* spec = nullptr;
  for (const Spec& s : all) {
    if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) spec = &s;
  }
  if (!spec) {
    std::string list;
    for (std::string_view n : supported_names()) {
      if (n.empty()) continue;
      list += list.empty() ? "" : ", ";
      list += n;
    }
    throw Error("tokenizer.ggml.pre: unsupported pre-tokenizer \"" + std::string(name) +
                "\" (supported: " + list + ")");
  }
  ignore_merges_ = spec->ignore_merges;
  for (const char* pattern : spec->regexes) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto re = std::make_unique<Regex>();
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    // The patterns are ours, so a compile failure is a bug, not bad input.
    EBB_CHECK_MSG(re->code != nullptr, pattern);
    // JIT is an optimisation: when unavailable, matching uses the interpreter.
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    regexes_.push_back(std::move(re));
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

std::vector<std::string_view> PreTokenizer::supported_names() {
  std::vector<std::string_view> names;
  for (const Spec& s : specs()) names.insert(names.end(), s.names.begin(), s.names.end());
  return names;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  // Valid runs go to the regexes; each invalid byte is a piece of its own
  // (PCRE2 in UTF mode must not see invalid UTF-8, and validating once here
  // lets every match skip its own O(n) check).
  std::vector<Piece> pieces;
  for (size_t i = 0, run = 0; i <= text.size();) {
    const size_t len = i < text.size() ? valid_utf8_char(text, i) : 0;
    if (len > 0) {
      i += len;
      continue;
    }
    if (i > run) pieces.push_back({text.substr(run, i - run), false});
    if (i == text.size()) break;
    pieces.push_back({text.substr(i, 1), true});
    run = ++i;
  }

  // Per call, not per tokenizer, so concurrent encode() calls never share it.
  const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
  EBB_CHECK(md != nullptr);
  std::vector<Piece> next;
  for (const auto& re : regexes_) {
    next.clear();
    for (const Piece& p : pieces) {
      if (p.raw) {
        next.push_back(p);
        continue;
      }
      // Match inside this piece only: lookaheads like (?!\S) and $ see the
      // piece's end, as in a sequence of Hugging Face Split pre-tokenizers.
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(p.text.data());
      const size_t n = p.text.size();
      size_t emitted = 0, off = 0;
      while (off < n) {
        int rc = pcre2_match(re->code, subj, n, off, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
          // Very long runs can exhaust the JIT stack; the interpreter keeps
          // its backtracking state on the heap.
          rc = pcre2_match(re->code, subj, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(),
                           nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          throw Error("pre-tokenizer \"" + name_ + "\": regex match failed (PCRE2 error " +
                      std::to_string(rc) + ")");
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // an empty match splits nothing: move one character on
          if (ms >= n) break;
          off = ms + std::min(n - ms, utf8_len(static_cast<uint8_t>(p.text[ms])));
          continue;
        }
        if (ms > emitted) next.push_back({p.text.substr(emitted, ms - emitted), false});
        next.push_back({p.text.substr(ms, me - ms), false});
        emitted = off = me;
      }
      if (emitted < n) next.push_back({p.text.substr(emitted), false});
    }
    pieces.swap(next);
  }

  std::vector<std::string_view> words;
  words.reserve(pieces.size());
  for (const Piece& p : pieces) words.push_back(p.text);
  return words;
}

}  // namespace ebb::tok
