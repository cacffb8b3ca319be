// Tokenizer tests: the golden .inp/.out vectors of every vocabulary in
// shared/golden/tokenizer (one test per vocabulary), the stories260K prompts,
// special-token parsing, streaming decode, malformed metadata and speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_pretok.h"
#include "platform/error.h"
#include "support.h"

namespace ebb {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string golden_dir() { return test::shared_path("golden/tokenizer"); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const std::unique_ptr<GgufFile> file = GgufFile::open(path);
  return Tokenizer::from_gguf(*file);
}

std::unique_ptr<Tokenizer> load_vocab(const std::string& name) {
  return load_tokenizer(golden_dir() + "/ggml-vocab-" + name + ".gguf");
}

// Vocabulary names ("llama-spm") that have a .gguf with .inp and .out.
std::vector<std::string> golden_vocabs() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(golden_dir(), ec)) {
    const std::string file = entry.path().filename().string();
    const std::string prefix = "ggml-vocab-", suffix = ".gguf";
    if (file.size() <= prefix.size() + suffix.size() || file.rfind(prefix, 0) != 0 ||
        file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string base = entry.path().string();
    if (fs::exists(base + ".inp") && fs::exists(base + ".out")) {
      names.push_back(file.substr(prefix.size(), file.size() - prefix.size() - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Cases of a .inp file: each case is followed by "\n__ggml_vocab_test__\n"
// (the newline before the marker belongs to the marker, not the case).
std::vector<std::string> read_cases(const std::string& path) {
  const std::string text = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> cases;
  size_t pos = 0;
  for (size_t hit; (hit = text.find(sep, pos)) != std::string::npos; pos = hit + sep.size()) {
    cases.push_back(text.substr(pos, hit - pos));
  }
  EXPECT_EQ(pos, text.size()) << path << ": text after the last separator";
  return cases;
}

// Lines of a .out file: the ids of each case, space separated.
std::vector<std::vector<TokenId>> read_expected(const std::string& path) {
  std::vector<std::vector<TokenId>> out;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<TokenId> ids;
    for (TokenId id; ls >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

std::string escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string ids_str(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

class TokenizerVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerVocab, Golden) {
  const std::string base = golden_dir() + "/ggml-vocab-" + GetParam() + ".gguf";
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(base);
  const std::vector<std::string> cases = read_cases(base + ".inp");
  const std::vector<std::vector<TokenId>> expected = read_expected(base + ".out");
  ASSERT_EQ(cases.size(), expected.size());
  ASSERT_GT(cases.size(), 0u);

  EncodeOptions opts;
  opts.add_bos = false;
  opts.parse_special = false;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<TokenId> ids = tok->encode(cases[i], opts);
    EXPECT_EQ(ids, expected[i]) << "case " << i << " \"" << escape(cases[i]) << "\"\n got:" << ids_str(ids)
                                << "\nwant:" << ids_str(expected[i]);
    // Both kinds are lossless on these texts: byte-level BPE by construction,
    // SentencePiece through byte fallback and the space-prefix rule.
    EXPECT_EQ(tok->decode(expected[i]), cases[i]) << "round trip of case " << i;
  }
}

std::string vocab_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerVocab, ::testing::ValuesIn(golden_vocabs()), vocab_test_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TokenizerVocab);

TEST(TokenizerGoldenFiles, AllVocabulariesHaveVectors) {
  // Guards against the parameterized suite silently running zero cases.
  EXPECT_GE(golden_vocabs().size(), 9u);
}

// The prompts of the model golden files, encoded with BOS by the reference.
TEST(TokenizerModels, PromptTokensMatchGolden) {
  for (const std::string model : {"stories260K", "tiny-llama-f16", "tiny-qwen3-f16"}) {
    const std::unique_ptr<Tokenizer> tok = load_tokenizer(test::model_path(model + ".gguf"));
    EXPECT_EQ(tok->model_name(), "llama");
    EXPECT_EQ(tok->bos(), 1);
    EXPECT_EQ(tok->eos(), 2);
    EXPECT_TRUE(tok->add_bos_default());
    EXPECT_TRUE(tok->is_eog(2));
    const std::vector<test::GoldenCase> golden = test::load_golden(model);
    ASSERT_FALSE(golden.empty());
    for (const test::GoldenCase& g : golden) {
      const std::vector<TokenId> ids = tok->encode(g.prompt);
      EXPECT_EQ(ids, g.prompt_tokens) << model << ": \"" << g.prompt << "\"";
      EXPECT_EQ(tok->decode(ids), g.prompt) << model;
    }
  }
}

TEST(TokenizerModels, StoriesOnceUponATime) {
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(test::model_path("stories260K.gguf"));
  EXPECT_EQ(tok->encode("Once upon a time"), (std::vector<TokenId>{1, 403, 407, 261, 378}));
  EncodeOptions no_bos;
  no_bos.add_bos = false;
  EXPECT_EQ(tok->encode("Once upon a time", no_bos), (std::vector<TokenId>{403, 407, 261, 378}));
  EXPECT_EQ(tok->encode("", {}), (std::vector<TokenId>{1}));
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->pad(), -1);  // stored as UINT32_MAX: absent
}

TEST(TokenizerSpecial, SentencePieceControlTokens) {
  const std::unique_ptr<Tokenizer> tok = load_vocab("llama-spm");
  EncodeOptions parse;
  parse.add_bos = false;
  parse.parse_special = true;
  EncodeOptions plain;
  plain.add_bos = false;
  const std::vector<TokenId> hello = tok->encode("Hello", plain);
  // Text after a special token gets the space prefix again, like text at the start.
  std::vector<TokenId> want = {1};
  want.insert(want.end(), hello.begin(), hello.end());
  want.push_back(2);
  EXPECT_EQ(tok->encode("<s>Hello</s>", parse), want);
  const std::vector<TokenId> as_text = tok->encode("<s>Hello</s>", plain);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 1), 0);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 2), 0);
  EXPECT_EQ(tok->decode(as_text), "<s>Hello</s>");
  // Control tokens are invisible unless asked for.
  EXPECT_EQ(tok->decode(want), "Hello");
  EXPECT_EQ(tok->decode(want, /*special=*/true), "<s>Hello</s>");
  EXPECT_EQ(tok->find_token("</s>"), 2);
  EXPECT_EQ(tok->find_token("no such token"), -1);
}

TEST(TokenizerSpecial, ChatMarkersAndEndOfTurn) {
  const std::unique_ptr<Tokenizer> tok = load_vocab("phi-3");
  const TokenId user = tok->find_token("<|user|>");
  const TokenId end = tok->find_token("<|end|>");
  ASSERT_GE(user, 0);
  ASSERT_GE(end, 0);
  EXPECT_TRUE(tok->is_control(user));
  EXPECT_EQ(tok->eot(), end);  // found by its text: the file names no eot id
  EXPECT_TRUE(tok->is_eog(end));
  EXPECT_TRUE(tok->is_eog(tok->eos()));
  EXPECT_FALSE(tok->is_eog(user));
  EncodeOptions parse;
  parse.add_bos = false;
  parse.parse_special = true;
  const std::vector<TokenId> ids = tok->encode("<|user|>\nHi<|end|>", parse);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), user);
  EXPECT_EQ(ids.back(), end);
  // The text after a special token has the space prefix, which decodes as a space.
  EXPECT_EQ(tok->decode(ids, true), "<|user|> \nHi<|end|>");
  EncodeOptions plain = parse;
  plain.parse_special = false;
  const std::vector<TokenId> text_ids = tok->encode("<|user|>", plain);
  EXPECT_EQ(std::count(text_ids.begin(), text_ids.end(), user), 0);
}

TEST(TokenizerSpecial, ByteLevelBpeControlTokens) {
  const std::unique_ptr<Tokenizer> tok = load_vocab("starcoder");
  EXPECT_EQ(tok->model_name(), "gpt2");
  EXPECT_EQ(tok->pre_tokenizer(), "starcoder");
  const TokenId prefix = tok->find_token("<fim_prefix>");
  const TokenId suffix = tok->find_token("<fim_suffix>");
  ASSERT_GE(prefix, 0);
  EncodeOptions parse;
  parse.add_bos = false;
  parse.parse_special = true;
  const std::string text = "<fim_prefix>def f():<fim_suffix>    return 1";
  const std::vector<TokenId> ids = tok->encode(text, parse);
  EXPECT_EQ(ids.front(), prefix);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), suffix), 1);
  EXPECT_EQ(tok->decode(ids, true), text);
  EXPECT_EQ(tok->decode(ids, false), "def f():    return 1");
  EncodeOptions plain = parse;
  plain.parse_special = false;
  const std::vector<TokenId> as_text = tok->encode(text, plain);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), prefix), 0);
  EXPECT_EQ(tok->decode(as_text), text);
}

TEST(TokenizerSpecial, UserDefinedTokensAlwaysMatch) {
  // MPT's vocabulary adds user-defined tokens for runs of spaces; like the
  // reference (and Hugging Face's added tokens) they are matched in plain
  // text too, which the golden vectors rely on.
  const std::unique_ptr<Tokenizer> tok = load_vocab("mpt");
  const std::string spaces(8, ' ');
  const TokenId run = tok->find_token(spaces);
  ASSERT_GE(run, 0);
  EncodeOptions plain;
  plain.add_bos = false;
  const std::vector<TokenId> ids = tok->encode("a" + spaces + "b", plain);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), run), 1);
  EXPECT_EQ(tok->decode(ids), "a" + spaces + "b");
}

TEST(TokenizerStream, HoldsBackSplitCharacters) {
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(test::model_path("stories260K.gguf"));
  // The 512-token vocabulary has none of these characters, so each is
  // spelled with <0xNN> byte tokens and split across several tokens.
  const std::string text = "Hi ж ✓ 😀!";
  const std::vector<TokenId> ids = tok->encode(text);
  ASSERT_EQ(ids.front(), tok->bos());
  StreamDecoder dec(*tok);
  std::string streamed;
  int held = 0;
  for (TokenId id : ids) {
    const std::string part = dec.push(id);
    if (part.empty() && tok->token_text(id).rfind("<0x", 0) == 0) ++held;
    // Every chunk handed out is whole characters.
    if (!part.empty()) {
      EXPECT_NE(static_cast<unsigned char>(part[0]) & 0xC0, 0x80) << "chunk starts inside a character";
    }
    streamed += part;
  }
  streamed += dec.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(streamed, tok->decode(ids));
  EXPECT_EQ(held, 1 + 2 + 3);  // bytes held back: ж (2-1), ✓ (3-1), 😀 (4-1)

  // A truncated character comes out at flush, not before.
  StreamDecoder dec2(*tok);
  const TokenId f0 = tok->find_token("<0xF0>");
  const TokenId x9f = tok->find_token("<0x9F>");
  ASSERT_GE(f0, 0);
  ASSERT_GE(x9f, 0);
  EXPECT_EQ(dec2.push(f0), "");
  EXPECT_EQ(dec2.push(x9f), "");
  EXPECT_EQ(dec2.flush(), "\xF0\x9F");
  // An invalid byte is passed on at once instead of being held forever.
  StreamDecoder dec3(*tok);
  EXPECT_EQ(dec3.push(x9f), "\x9F");
}

TEST(TokenizerStream, ByteLevelBpeSplitsCharacters) {
  const std::unique_ptr<Tokenizer> tok = load_vocab("gpt-2");
  EncodeOptions plain;
  plain.add_bos = false;
  const std::string text = "emoji 🦙 and 😀 in text";
  const std::vector<TokenId> ids = tok->encode(text, plain);
  StreamDecoder dec(*tok);
  std::string streamed;
  for (TokenId id : ids) streamed += dec.push(id);
  streamed += dec.flush();
  EXPECT_EQ(streamed, text);
}

// Bytes that are not UTF-8 survive SentencePiece (byte tokens) and byte-level
// BPE whose vocabulary has all 256 byte symbols; vocabularies that lack some
// (falcon has no symbol for 0xFF) drop those bytes, as the reference does.
TEST(TokenizerRobustness, InvalidUtf8) {
  const std::string text = std::string("ok \xFF\xFE x\xC3 \xE2\x82 end\xF0\x9F");
  EncodeOptions plain;
  plain.add_bos = false;
  for (const std::string name : {"llama-spm", "gpt-2", "deepseek-llm", "falcon"}) {
    const std::unique_ptr<Tokenizer> tok = load_vocab(name);
    const std::string back = tok->decode(tok->encode(text, plain));
    if (name == "llama-spm" || name == "gpt-2") {
      EXPECT_EQ(back, text) << name;
    } else {
      EXPECT_EQ(back.substr(0, 3), "ok ") << name;
      EXPECT_NE(back.find(" end"), std::string::npos) << name;
    }
    EXPECT_TRUE(tok->encode("", plain).empty()) << name;
  }
}

std::vector<std::string> split_words(const tok::PreTokenizer& pre, const std::string& text) {
  std::vector<std::string> out;
  for (std::string_view w : pre.split(text)) out.emplace_back(w);
  return out;
}

TEST(TokenizerPretok, EveryNamedPatternCompilesAndSplitsLosslessly) {
  const std::string text = "Hello  world's 12345 times!!\n\n\tÄpfel 山田 ДА 🦙 x=1;";
  for (std::string_view name : tok::PreTokenizer::supported_names()) {
    const tok::PreTokenizer pre(name);
    std::string joined;
    for (const std::string& w : split_words(pre, text)) {
      EXPECT_FALSE(w.empty()) << name;
      joined += w;
    }
    EXPECT_EQ(joined, text) << name;
  }
  try {
    tok::PreTokenizer bad("no-such-pre");
    ADD_FAILURE() << "unknown pre-tokenizer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-pre"), std::string::npos) << e.what();
  }
}

// Splits that follow from the published regexes (no golden vocabulary here
// uses the Llama 3 or Qwen2 pre-tokenizers).
TEST(TokenizerPretok, KnownSplits) {
  using V = std::vector<std::string>;
  const tok::PreTokenizer llama3("llama-bpe");
  EXPECT_TRUE(llama3.ignore_merges());
  EXPECT_EQ(split_words(llama3, "Hello world 12345"), (V{"Hello", " world", " ", "123", "45"}));
  EXPECT_EQ(split_words(llama3, "I'VE  done\n\n x"), (V{"I", "'VE", " ", " done", "\n\n", " x"}));
  const tok::PreTokenizer qwen2("qwen2");
  EXPECT_EQ(split_words(qwen2, "abc 123"), (V{"abc", " ", "1", "2", "3"}));
  const tok::PreTokenizer gpt2("gpt-2");
  EXPECT_EQ(split_words(gpt2, "I've 2 cats!!  "), (V{"I", "'ve", " 2", " cats", "!!", "  "}));
  const tok::PreTokenizer coder("deepseek-coder");
  EXPECT_EQ(split_words(coder, "x = 10\n"), (V{"x", " = ", "1", "0", "\n"}));
}

// Writes a small GGUF with a tokenizer; `edit` adjusts the keys.
std::string write_vocab(const std::string& dir, const std::string& name,
                        const std::function<void(GgufWriter&)>& edit) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "b"});
  w.set_float32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2});
  w.set_int32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1});
  edit(w);
  const std::string path = dir + "/" + name + ".gguf";
  w.write(path, [](size_t, uint8_t*) {});
  return path;
}

void expect_error_naming(const std::string& path, const std::string& needle) {
  try {
    load_tokenizer(path);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerMetadata, MalformedVocabulariesAreRejected) {
  const std::string dir = test::make_temp_dir("ebb_tok");
  const std::string ok = write_vocab(dir, "ok", [](GgufWriter&) {});
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(ok);
  EncodeOptions plain;
  plain.add_bos = false;
  EXPECT_EQ(tok->encode("a", plain), (std::vector<TokenId>{3}));

  expect_error_naming(write_vocab(dir, "short_scores", [](GgufWriter& w) {
                        w.set_float32_array("tokenizer.ggml.scores", {0, 0, 0});
                      }),
                      "tokenizer.ggml.scores");
  expect_error_naming(write_vocab(dir, "short_types", [](GgufWriter& w) {
                        w.set_int32_array("tokenizer.ggml.token_type", {1, 1});
                      }),
                      "tokenizer.ggml.token_type");
  expect_error_naming(write_vocab(dir, "bad_type", [](GgufWriter& w) {
                        w.set_int32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 9});
                      }),
                      "tokenizer.ggml.token_type");
  expect_error_naming(write_vocab(dir, "bad_bos", [](GgufWriter& w) {
                        w.set_uint32("tokenizer.ggml.bos_token_id", 5);
                      }),
                      "tokenizer.ggml.bos_token_id");
  expect_error_naming(write_vocab(dir, "bad_model", [](GgufWriter& w) {
                        w.set_string("tokenizer.ggml.model", "bert");
                      }),
                      "bert");
  expect_error_naming(write_vocab(dir, "bad_pre", [](GgufWriter& w) {
                        w.set_string("tokenizer.ggml.model", "gpt2");
                        w.set_string("tokenizer.ggml.pre", "nonesuch");
                        w.set_string_array("tokenizer.ggml.merges", {"a b"});
                      }),
                      "nonesuch");
  expect_error_naming(write_vocab(dir, "no_merges", [](GgufWriter& w) {
                        w.set_string("tokenizer.ggml.model", "gpt2");
                      }),
                      "tokenizer.ggml.merges");
  expect_error_naming(write_vocab(dir, "bad_tokens", [](GgufWriter& w) {
                        w.set_float32_array("tokenizer.ggml.tokens", {1, 2});
                      }),
                      "tokenizer.ggml.tokens");
  fs::remove_all(dir);
}

// 100 KB of text in well under a second, also as one long "word" (no
// quadratic merge loop).
TEST(TokenizerPerformance, LongTextsEncodeQuickly) {
  std::string prose;
  while (prose.size() < 100 * 1024) {
    prose += "The quick brown fox, 1234 times, jumped over the lazy dog's back!\n\tÄpfel über 山 🦙 ";
  }
  const std::string word(100 * 1024, 'a');
  for (const std::string name : {"llama-spm", "gpt-2", "deepseek-llm", "mpt"}) {
    const std::unique_ptr<Tokenizer> tok = load_vocab(name);
    EncodeOptions plain;
    plain.add_bos = false;
    for (const std::string* text : std::vector<const std::string*>{&prose, &word}) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<TokenId> ids = tok->encode(*text, plain);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(s, 0.5) << name << ": " << text->size() << " bytes took " << s << " s";
      EXPECT_EQ(tok->decode(ids), *text) << name;
    }
  }
}

}  // namespace
}  // namespace ebb
