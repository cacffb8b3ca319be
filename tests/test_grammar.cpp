// Grammar engine tests: GBNF parsing (the files in tests/data/grammars and
// the syntax one feature at a time), parse errors with line and column,
// the matcher on bytes (partial UTF-8, the cached DFA against the uncached
// stacks), token masks on a real BPE vocabulary against a per-token brute
// force, random walks over allowed tokens, lazy triggers, and the sampler's
// grammar stage.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "platform/error.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/grammar_matcher.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_trie.h"
#include "runtime/sampler.h"

namespace ebb::grammar {
namespace {

// EBB_SHARED_DIR is "<source dir>/../shared".
std::string source_dir() {
  std::string s = EBB_SHARED_DIR;
  return s.substr(0, s.size() - std::string("/../shared").size());
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::shared_ptr<const Grammar> grammar_file(const std::string& name) {
  return Grammar::parse(read_text(source_dir() + "/tests/data/grammars/" + name));
}

// True when the whole text is a sentence of the grammar.
bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.is_accepting();
}
bool matches(std::string_view gbnf, std::string_view text) { return matches(Grammar::parse(gbnf), text); }

std::string parse_error(std::string_view gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct FileCase {
  const char* file;
  std::vector<const char*> good, bad;
};

TEST(Grammar, FilesParseAndConstrain) {
  const FileCase cases[] = {
      {"json.gbnf",
       {"{}", "[]", "0", "-1.5e+3", "\"a\\n\\u00e9\"", "{\"a\": [1, {\"b\": null}], \"c\": true}", "{\n  \"k\": \"v\"\n}"},
       {"{", "{\"a\" 1}", "01", "[1,]", "\"\x01\"", "{\"a\":1}}", "tru", "{  \"a\":1}"}},
      {"arithmetic.gbnf", {"1", "1 + 2*3", "-(4 - 2) / 7", "((1))"}, {"", "1 +", "(1", "1 ++ 2", "a"}},
      {"list.gbnf", {"- milk\n", "- a\n- b\n- c\n"}, {"", "- \n", "milk\n", "- a\n- b\n- c\n- d\n- e\n- f\n"}},
      {"chess.gbnf", {"1. e4 e5", "1. e4 e5 2. Nf3 Nc6 3. Bb5", "1. exd5 O-O-O+ 2. e8=Q#"}, {"1. e9", "e4", "1. Kz1"}},
      {"c_like.gbnf", {"int x = 3;\n", "int x;\nx = f(x, 2) + 'a';\nreturn x;\n"}, {"int x = ;\n", "x = 1\n", "int 3x;\n"}},
      {"unicode.gbnf", {"héllo", "こんにちは, привет", "你好, 😀"}, {"hello", "héllo,", "\xF0\x9F\x98"}},
  };
  for (const FileCase& c : cases) {
    SCOPED_TRACE(c.file);
    const auto g = grammar_file(c.file);
    for (const char* s : c.good) EXPECT_TRUE(matches(g, s)) << s;
    for (const char* s : c.bad) EXPECT_FALSE(matches(g, s)) << s;
  }
}

TEST(Grammar, Syntax) {
  EXPECT_TRUE(matches(R"(root ::= "a" | "b" "c")", "bc"));
  EXPECT_FALSE(matches(R"(root ::= "a" | "b" "c")", "b"));
  // repetitions
  EXPECT_TRUE(matches(R"(root ::= "q"{,2})", "qq"));
  EXPECT_FALSE(matches(R"(root ::= "q"{,2})", "qqq"));
  const char* rep = R"(root ::= "x"{2} "y"{1,} "z"{0,2} ("ab"){1,3} "w"? "v"* "u"+)";
  EXPECT_TRUE(matches(rep, "xxyabu"));
  EXPECT_TRUE(matches(rep, "xxyyyzzababwvvvuu"));
  EXPECT_FALSE(matches(rep, "xyabu"));       // {2}
  EXPECT_FALSE(matches(rep, "xxabu"));       // {1,}
  EXPECT_FALSE(matches(rep, "xxyzzzabu"));   // {0,2}
  EXPECT_FALSE(matches(rep, "xxyababababu"));  // {1,3}
  EXPECT_FALSE(matches(rep, "xxyab"));       // +
  // escapes, classes, any
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\U0001F600\t\n\"\\")", "A\xC3\xA9\xF0\x9F\x98\x80\t\n\"\\"));
  EXPECT_TRUE(matches(R"(root ::= [a-cx] [^a-z] .)", "x9\xE2\x82\xAC"));
  EXPECT_FALSE(matches(R"(root ::= [a-cx] [^a-z] .)", "xq!"));
  EXPECT_TRUE(matches(R"(root ::= [\]\\-] [-a])", "]-"));
  // comments, rules over lines, names with dashes, alternatives on new lines
  const char* multi = "# comment\nroot ::= a-b # trailing\n  | \"z\"\na-b ::= (\n  \"a\"\n  | \"b\"\n)\n";
  EXPECT_TRUE(matches(multi, "a"));
  EXPECT_TRUE(matches(multi, "z"));
  EXPECT_FALSE(matches(multi, "c"));
  // llama.cpp's layout: an empty first alternative, '|' ending a line.
  const char* ws = "root ::= \"a\" ws \"b\"\nws ::= | \" \" |\n  \"\\n\" [ \\t]{0,20}\n";
  EXPECT_TRUE(matches(ws, "ab"));
  EXPECT_TRUE(matches(ws, "a b"));
  EXPECT_TRUE(matches(ws, "a\n\t b"));
  EXPECT_FALSE(matches(ws, "a  b"));
  // empty alternative and right recursion in constant depth
  EXPECT_TRUE(matches("root ::= \"(\" root \")\" | \"\"", "((()))"));
  EXPECT_TRUE(matches("root ::= [a]*", std::string(20000, 'a')));
}

TEST(Grammar, ErrorsNameLineAndColumn) {
  EXPECT_NE(parse_error("root ::= \"a\"\nfoo ::= bar\n").find("line 2 column 9: undefined rule 'bar'"), std::string::npos)
      << parse_error("root ::= \"a\"\nfoo ::= bar\n");
  EXPECT_NE(parse_error("root ::= \"abc\n").find("line 1"), std::string::npos);
  EXPECT_NE(parse_error("root ::= [a-\n").find("line 1"), std::string::npos);
  EXPECT_NE(parse_error("root := \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(parse_error("foo ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"a\" )").find("line 1 column 14"), std::string::npos);
  EXPECT_NE(parse_error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(parse_error("root ::= *").find("nothing before it"), std::string::npos);
  // Left recursion: direct, indirect, and hidden behind a nullable rule.
  EXPECT_NE(parse_error("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= x\nx ::= y \"a\"\ny ::= x | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(parse_error("root ::= e? root \"a\" | \"b\"\ne ::= \"e\"").find("left-recursive"), std::string::npos);
  EXPECT_EQ(parse_error("root ::= \"a\" root | \"b\""), "");  // right recursion is fine
  // Limits: a huge repetition is refused up front, not expanded.
  const std::string big = parse_error("root ::= \"a\"{0,100000}");
  EXPECT_NE(big.find("over the limit of 10000"), std::string::npos) << big;
  EXPECT_NE(parse_error("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')')).find("nested deeper"),
            std::string::npos);
  GrammarLimits small;
  small.max_rules = 50;
  EXPECT_THROW(Grammar::parse("root ::= \"a\"{0,100}", small), Error);
}

TEST(Matcher, PartialUtf8) {
  auto g = Grammar::parse(R"(root ::= "é" "日本" [a-z])");
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes("\xC3"));  // inside é
  EXPECT_TRUE(m.in_partial_char(m.state()));
  EXPECT_FALSE(m.can_accept_bytes("a"));        // not a continuation byte
  ASSERT_TRUE(m.accept_bytes("\xA9\xE6"));      // é done, 日 begun
  EXPECT_FALSE(m.can_accept_bytes("\x9C\xAC"));  // 朩 (U+6729) shares the lead byte but not the character
  ASSERT_TRUE(m.accept_bytes("\x97\xA5\xE6\x9C"));
  EXPECT_FALSE(m.is_accepting());
  ASSERT_TRUE(m.accept_bytes("\xAC" "q"));
  EXPECT_TRUE(m.is_accepting());
  // A lead byte is refused when no stack could take any character it starts.
  GrammarMatcher ascii(Grammar::parse("root ::= [a-z]+"));
  EXPECT_FALSE(ascii.can_accept_bytes("\xC3"));
  EXPECT_FALSE(ascii.can_accept_bytes("\x80"));
  GrammarMatcher any(Grammar::parse("root ::= .+"));
  EXPECT_TRUE(any.can_accept_bytes("\xF0\x9F"));
  EXPECT_FALSE(any.can_accept_bytes("\xF0\x41"));  // broken sequence
  EXPECT_FALSE(any.can_accept_bytes("\xF8"));      // not a UTF-8 lead
  EXPECT_TRUE(any.accept_bytes("\xF0\x9F"));
  EXPECT_FALSE(any.is_accepting());                // never complete inside a character
}

TEST(Matcher, DeepRuleChainsAreRefusedNotACrash) {
  // root ::= r1, r1 ::= r2, ... : each reference at the start of a rule is
  // one level of the matcher's closure.
  auto chain = [](int n) {
    std::string g = "root ::= r1\n";
    for (int i = 1; i < n; ++i) g += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
    return g + "r" + std::to_string(n) + " ::= \"x\"\n";
  };
  EXPECT_TRUE(matches(chain(1000), "x"));
  const auto deep = Grammar::parse(chain(20000));
  try {
    GrammarMatcher m(deep);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nest more than"), std::string::npos) << e.what();
  }
}

TEST(Matcher, CachedStepsAgreeWithStacks) {
  // Random byte strings, biased towards the grammar's alphabet, through the
  // cached DFA and through the uncached stacks: the same verdict every time.
  const auto g = grammar_file("json.gbnf");
  GrammarMatcher m(g);
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\",:0123456789-.eE truefalsn\\u\n\xC3\xA9";
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    const bool cached = m.run(m.state(), s) != GrammarMatcher::kReject;
    ASSERT_EQ(cached, m.reference_accepts(m.state(), s)) << s;
    accepted += cached;
  }
  EXPECT_GT(accepted, 50);  // the test saw both verdicts
  EXPECT_LT(accepted, 2950);
}

TEST(Matcher, TrimKeepsTheState) {
  MatcherLimits limits;
  limits.max_states = 4;
  GrammarMatcher m(grammar_file("json.gbnf"), limits);
  ASSERT_TRUE(m.accept_bytes("{\"a\": [1, {\"b\": [tr"));
  EXPECT_GT(m.n_states(), 4u);
  m.trim();
  EXPECT_LE(m.n_states(), 3u);
  EXPECT_FALSE(m.can_accept_bytes("x"));
  EXPECT_TRUE(m.accept_bytes("ue]}]}"));
  EXPECT_TRUE(m.is_accepting());
  // Trimmed inside a character: E4 (the bits dropped: every completion is a
  // string character) and E0 (kept: the next byte must be A0-BF).
  const std::pair<const char*, const char*> tails[] = {{"\xE4", "\xB8\xAD"}, {"\xE0", "\xA4\x80"}};
  for (const auto& [lead, rest] : tails) {
    GrammarMatcher p(grammar_file("json.gbnf"), limits);
    ASSERT_TRUE(p.accept_bytes(std::string("{\"a\": [1, {\"b\": \"h") + lead));
    ASSERT_TRUE(p.trim());
    EXPECT_FALSE(p.can_accept_bytes("\""));  // still inside the character
    EXPECT_EQ(p.can_accept_bytes("\x80\x80"), std::string(lead) == "\xE4");  // E0 80 80 is overlong
    EXPECT_TRUE(p.accept_bytes(std::string(rest) + "\"}]}"));
    EXPECT_TRUE(p.is_accepting());
  }
}

// --- token level -------------------------------------------------------------

std::unique_ptr<Tokenizer> load_vocab(const std::string& name) {
  const std::unique_ptr<GgufFile> file =
      GgufFile::open(std::string(EBB_SHARED_DIR) + "/golden/tokenizer/ggml-vocab-" + name + ".gguf");
  return Tokenizer::from_gguf(*file);
}

// The real byte-level BPE vocabulary used below (102,400 tokens; the shared
// folder has no Qwen2 vocab-only GGUF).
const TokenTrie& bpe_trie() {
  static const std::shared_ptr<const TokenTrie> trie = TokenTrie::from_tokenizer(*load_vocab("deepseek-llm"));
  return *trie;
}

// Brute force: each token's bytes through the uncached stacks.
std::vector<uint8_t> brute_mask(GrammarConstraint& c) {
  const TokenTrie& v = c.vocab();
  std::vector<uint8_t> mask(static_cast<size_t>(v.n_vocab()));
  GrammarMatcher& m = c.matcher();
  for (int32_t id = 0; id < v.n_vocab(); ++id) {
    const std::string_view p = v.piece(id);
    mask[static_cast<size_t>(id)] =
        (v.is_eog(id) || p.empty()) ? m.is_accepting() : m.reference_accepts(m.state(), p);
  }
  return mask;
}

TEST(TokenMask, TrieHoldsEveryToken) {
  const TokenTrie& t = bpe_trie();
  ASSERT_EQ(t.n_vocab(), 102400);
  size_t in_trie = 0;
  for (const auto& nd : t.nodes()) {
    in_trie += nd.tok_end - nd.tok_begin;
    EXPECT_GT(nd.subtree_end, 0u);
  }
  EXPECT_EQ(in_trie + t.eog_tokens().size() + t.empty_tokens().size(), 102400u);
  // Walking a token's bytes down the pre-order reaches a node that lists it.
  for (int32_t id : {0, 500, 12345, 99999}) {
    const std::string_view p = t.piece(id);
    size_t i = 0;
    for (size_t d = 0; d < p.size(); ++d) {
      while (t.nodes()[i].byte != static_cast<uint8_t>(p[d]) || t.nodes()[i].depth != d + 1) i = t.nodes()[i].subtree_end;
      if (d + 1 < p.size()) ++i;
    }
    const auto& nd = t.nodes()[i];
    const auto& toks = t.node_tokens();
    EXPECT_NE(std::find(toks.begin() + nd.tok_begin, toks.begin() + nd.tok_end, id), toks.begin() + nd.tok_end);
  }
}

TEST(TokenMask, EqualsBruteForce) {
  const auto vocab = std::shared_ptr<const TokenTrie>(&bpe_trie(), [](const TokenTrie*) {});
  const std::string schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},
      "n":{"type":"integer","minimum":-5,"maximum":300},"tags":{"type":"array","items":{"enum":["x","yz"]}},
      "ok":{"type":"boolean"}},"required":["name","n"]})";
  struct Case {
    std::shared_ptr<const Grammar> g;
    std::vector<std::string> prefixes;
  };
  const Case cases[] = {
      {grammar_file("json.gbnf"), {"", "{", "{\"a", "{\"a\": [1", "{\"a\": \"h\xC3", "[tr", "[1, 2]"}},
      {Grammar::parse(json_schema_to_gbnf(schema)), {"", "{\"name\": \"ab", "{\"name\":\"\",\"n\":2", "{\"name\":\"\",\"n\":-5,"}},
      {grammar_file("unicode.gbnf"), {"", "\xE3\x81", "h\xC3\xA9llo, "}},
  };
  std::vector<uint8_t> mask(bpe_trie().n_vocab());
  for (const Case& c : cases) {
    for (const std::string& pre : c.prefixes) {
      SCOPED_TRACE(pre);
      GrammarConstraint con(c.g, vocab);
      ASSERT_TRUE(con.matcher().accept_bytes(pre));
      const size_t n = con.fill_mask(mask);
      const std::vector<uint8_t> want = brute_mask(con);
      size_t n_want = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        n_want += want[i];
        if (mask[i] != want[i]) ADD_FAILURE() << "token " << i << " \"" << bpe_trie().piece(int32_t(i)) << "\" mask " << int(mask[i]);
      }
      EXPECT_EQ(n, n_want);
      EXPECT_GT(n, 0u);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(con.allows(int32_t(i)), want[i] != 0) << i;
      // A second mask in the same state (from the mask cache when the state
      // is wide) is the same, and creates no DFA state: the steady state
      // allocates nothing.
      const size_t states = con.matcher().n_states();
      const std::vector<uint8_t> first = mask;
      std::fill(mask.begin(), mask.end(), uint8_t{9});
      EXPECT_EQ(con.fill_mask(mask), n);
      EXPECT_EQ(mask, first);
      EXPECT_EQ(con.matcher().n_states(), states);
    }
  }
}

TEST(TokenMask, SentencePieceVocabulary) {
  // Byte tokens (<0xE4>) and "▁" pieces: the same walk, the same agreement.
  const auto vocab = TokenTrie::from_tokenizer(*load_vocab("llama-spm"));
  EXPECT_EQ(vocab->piece(vocab->n_vocab() > 259 ? 3 + 0xE4 : 0), "\xE4");  // <0xE4> is id 231
  std::vector<uint8_t> mask(vocab->n_vocab());
  for (const char* prefix : {"", "{\"a\": \"x", "{\"a\": \"\xE4\xB8", "[1, tr"}) {
    SCOPED_TRACE(prefix);
    GrammarConstraint con(grammar_file("json.gbnf"), vocab);
    ASSERT_TRUE(con.matcher().accept_bytes(prefix));
    con.fill_mask(mask);
    EXPECT_EQ(mask, brute_mask(con));
  }
}

TEST(TokenMask, RandomWalksEndAccepted) {
  const auto vocab = std::shared_ptr<const TokenTrie>(&bpe_trie(), [](const TokenTrie*) {});
  const auto g = Grammar::parse(json_schema_to_gbnf(std::string_view(
      R"({"type":"object","properties":{"id":{"type":"integer","minimum":1,"maximum":99},
          "city":{"type":"string","maxLength":6},"kind":{"enum":["a","b"]}},"required":["id","kind"]})")));
  std::mt19937 rng(3);
  std::vector<uint8_t> mask(vocab->n_vocab());
  int ended = 0;
  for (int walk = 0; walk < 20; ++walk) {
    GrammarConstraint con(g, vocab);
    std::string text;
    for (int step = 0; step < 200; ++step) {
      con.fill_mask(mask);
      std::vector<int32_t> allowed;
      for (size_t i = 0; i < mask.size(); ++i)
        if (mask[i]) allowed.push_back(int32_t(i));
      ASSERT_FALSE(allowed.empty()) << text;
      const int32_t t = allowed[rng() % allowed.size()];
      con.accept(t);
      if (vocab->is_eog(t)) {
        EXPECT_TRUE(con.is_complete());
        ++ended;
        break;
      }
      text += vocab->piece(t);
      // Every prefix stays a viable prefix for a fresh matcher.
      GrammarMatcher fresh(g);
      ASSERT_TRUE(fresh.accept_bytes(text)) << text;
    }
    if (con.is_complete()) {
      EXPECT_TRUE(matches(g, text)) << text;
    }
  }
  EXPECT_GT(ended, 0);
}

TEST(TokenMask, WholeSubtreesOnlyWhenEveryPathLoops) {
  // Every string of up to 3 fragments (valid and broken UTF-8 pieces,
  // quotes, controls) as a vocabulary, masked in states that loop on some
  // or all characters: the walk's subtree shortcut must agree with the
  // per-token brute force.
  const std::vector<std::string> frags = {"a", "b", " ", "\"", "\\", "\x01", "\xC3", "\xA9", "\xE0",
                                          "\xA0", "\x80", "\xED", "\xF0", "\x90", "\xE4\xB8\xAD"};
  std::vector<std::string> pieces;
  for (const auto& x : frags) {
    pieces.push_back(x);
    for (const auto& y : frags) {
      pieces.push_back(x + y);
      for (const auto& z : frags) pieces.push_back(x + y + z);
    }
  }
  // Subtrees the shortcut may take whole: below "d" only valid non-ASCII
  // characters, below "c" non-ASCII bytes that are not valid UTF-8, below
  // "e" only letters.
  for (const char* t : {"d\xC3\xA9", "d\xE4\xB8\xAD", "d\xC3\xA9\xC3", "d\xF0\x9F\x98\x80", "c\xA9", "c\xE0\x80",
                        "c\xC3", "c\xED\xA0\x80", "eab", "ebb", "eba"})
    pieces.push_back(t);
  auto vocab = std::make_shared<const TokenTrie>(pieces, std::vector<uint8_t>{});
  const std::pair<const char*, const char*> cases[] = {
      {"json.gbnf", "[\"x"},                     // a JSON string: every character but " and \ loops
      {"json.gbnf", "[\"x\xC3"},                 // inside a character
      {nullptr, "ab"},                           // [a-z ]*: ASCII loops, nothing else does
      {"count", "<"},                            // [^<>]{0,4}: each character one count further
      {"count", "<ab"},
  };
  std::vector<uint8_t> mask(pieces.size());
  for (const auto& [file, prefix] : cases) {
    SCOPED_TRACE(prefix);
    auto g = !file                            ? Grammar::parse("root ::= [a-z ]* \"!\"")
             : std::string(file) == "count" ? Grammar::parse("root ::= \"<\" [^<>]{0,4} \">\"")
                                            : grammar_file(file);
    GrammarConstraint con(g, vocab);
    ASSERT_TRUE(con.matcher().accept_bytes(prefix));
    const size_t n = con.fill_mask(mask);
    const std::vector<uint8_t> want = brute_mask(con);
    EXPECT_EQ(mask, want);
    EXPECT_GT(n, 10u);
  }
}

TEST(TokenMask, WarmCopiesAreIndependent) {
  const auto vocab = std::shared_ptr<const TokenTrie>(&bpe_trie(), [](const TokenTrie*) {});
  GrammarConstraint proto(grammar_file("json.gbnf"), vocab);
  std::vector<uint8_t> mask(vocab->n_vocab()), want(vocab->n_vocab());
  EncodeOptions eo;
  eo.add_bos = false;
  const auto tok = load_vocab("deepseek-llm");
  for (const TokenId t : tok->encode("{\"k\": [1, \"two\"]}", eo)) {  // warm the caches
    proto.fill_mask(mask);
    proto.accept(t);
  }
  ASSERT_TRUE(proto.is_complete());
  proto.reset();
  GrammarConstraint a = proto.copy();
  EXPECT_EQ(a.matcher().n_states(), proto.matcher().n_states());
  for (const TokenId t : tok->encode("{\"x\": \"y", eo)) a.accept(t);
  EXPECT_TRUE(a.matcher().can_accept_bytes("}"));  // inside the string
  EXPECT_FALSE(proto.matcher().can_accept_bytes("}"));  // the prototype did not move
  EXPECT_TRUE(proto.matcher().can_accept_bytes("{"));
  a.fill_mask(mask);
  GrammarConstraint fresh(grammar_file("json.gbnf"), vocab);
  ASSERT_TRUE(fresh.matcher().accept_bytes("{\"x\": \"y"));
  fresh.fill_mask(want);
  EXPECT_EQ(mask, want);
}

TEST(TokenMask, EogAndControlTokens) {
  std::vector<std::string> pieces = {"a", "b", "", "ab", "</s>", "\xC3", "\xA9"};
  std::vector<uint8_t> eog = {0, 0, 0, 0, 1, 0, 0};
  auto vocab = std::make_shared<const TokenTrie>(pieces, eog);
  GrammarConstraint con(Grammar::parse(R"(root ::= "a" "b"? | "é")"), vocab);
  std::vector<uint8_t> mask(9, 7);  // a row wider than the vocabulary
  EXPECT_EQ(con.fill_mask(mask), 3u);
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 0, 0, 1, 0, 1, 0, 0, 0}));  // a, ab, and é's first byte
  con.accept(5);
  con.fill_mask(mask);
  EXPECT_EQ(mask, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 1, 0, 0}));
  con.accept(6);
  con.fill_mask(mask);  // complete: only end and control tokens
  EXPECT_EQ(mask, (std::vector<uint8_t>{0, 0, 1, 0, 1, 0, 0, 0, 0}));
  con.reset();
  EXPECT_THROW(con.accept(4), Error);  // end before the grammar is complete
  EXPECT_THROW(con.accept(1), Error);
  con.accept(0);
  EXPECT_TRUE(con.is_complete());
  EXPECT_TRUE(con.allows(4));
  EXPECT_TRUE(con.allows(1));
}

TEST(Lazy, TriggerWordAcrossTokens) {
  std::vector<std::string> pieces = {"hi ", "<to", "ol>", "{", "}", "x", "<tool>", "</s>"};
  std::vector<uint8_t> eog = {0, 0, 0, 0, 0, 0, 0, 1};
  auto vocab = std::make_shared<const TokenTrie>(pieces, eog);
  auto g = Grammar::parse(R"(root ::= "<tool>" "{" "x"* "}")");
  ConstraintOptions opts;
  opts.lazy = true;
  opts.trigger_words = {"<tool>"};
  GrammarConstraint con(g, vocab, opts);
  std::vector<uint8_t> mask(pieces.size());
  EXPECT_FALSE(con.active());
  EXPECT_EQ(con.fill_mask(mask), pieces.size());  // free text before the trigger
  con.accept(0);
  con.accept(1);
  EXPECT_FALSE(con.active());
  con.accept(2);  // "<to" + "ol>" completes the trigger
  EXPECT_TRUE(con.active());
  con.fill_mask(mask);
  EXPECT_EQ(mask, (std::vector<uint8_t>{0, 0, 0, 1, 0, 0, 0, 0}));
  con.accept(3);
  con.accept(5);
  EXPECT_FALSE(con.allows(7));
  con.accept(4);
  EXPECT_TRUE(con.allows(7));
  con.reset();
  EXPECT_FALSE(con.active());

  // A trigger token: its piece starts the grammar.
  ConstraintOptions by_token;
  by_token.lazy = true;
  by_token.trigger_tokens = {6};
  GrammarConstraint con2(g, vocab, by_token);
  con2.accept(1);
  con2.accept(5);
  EXPECT_FALSE(con2.active());
  con2.accept(6);
  EXPECT_TRUE(con2.active());
  EXPECT_TRUE(con2.allows(3));
  EXPECT_FALSE(con2.allows(5));

  // A grammar that does not begin with its trigger is refused at activation.
  GrammarConstraint bad(Grammar::parse(R"(root ::= "{" "}")"), vocab, opts);
  EXPECT_THROW(bad.accept(6), Error);
  ConstraintOptions none;
  none.lazy = true;
  EXPECT_THROW(GrammarConstraint(g, vocab, none), Error);
}

// --- sampler -------------------------------------------------------------------

TEST(SamplerGrammar, NeverEmitsDisallowedTokens) {
  // A vocabulary of single letters and digits; the grammar wants digits.
  std::vector<std::string> pieces;
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) pieces.push_back(std::string(1, c));
  pieces.push_back("");  // end token
  std::vector<uint8_t> eog(pieces.size(), 0);
  eog.back() = 1;
  auto vocab = std::make_shared<const TokenTrie>(pieces, eog);
  auto g = Grammar::parse("root ::= [0-9]{3}");
  const int32_t n = static_cast<int32_t>(pieces.size());
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (float temp : {0.0f, 0.7f, 1.5f}) {
    SamplerOptions o;
    o.temperature = temp;
    o.top_k = 0;
    o.min_p = 0.0f;
    o.top_p = 1.0f;
    o.seed = 5;
    Sampler s(o, n);
    s.set_constraint(std::make_shared<GrammarConstraint>(g, vocab));
    for (int run = 0; run < 50; ++run) {
      s.reset();
      std::string text;
      for (int k = 0; k < 4; ++k) {
        std::vector<float> logits(static_cast<size_t>(n));
        for (auto& x : logits) x = nd(rng);
        logits[0] = 100.0f;  // 'a' would win unconstrained
        const int32_t t = s.sample(logits);
        s.accept(t);
        if (k < 3) {
          ASSERT_TRUE(t >= 26 && t < 36) << t;
          text += pieces[static_cast<size_t>(t)];
        } else {
          ASSERT_EQ(t, n - 1);  // only the end is left
        }
      }
      EXPECT_TRUE(matches(g, text));
    }
  }
}

TEST(SamplerGrammar, GreedyIsTheAllowedArgmaxAndDrawsFollowTheMaskedDistribution) {
  std::vector<std::string> pieces = {"a", "b", "c", "d"};
  auto vocab = std::make_shared<const TokenTrie>(pieces, std::vector<uint8_t>{});
  auto g = Grammar::parse("root ::= [bcd]");
  const std::vector<float> logits = {5.0f, 1.0f, 0.0f, std::log(2.0f)};
  SamplerOptions greedy;
  greedy.temperature = 0.0f;
  Sampler sg(greedy, 4);
  sg.set_constraint(std::make_shared<GrammarConstraint>(g, vocab));
  EXPECT_EQ(sg.sample(logits), 1);
  // At temperature 1 with no filters, b:c:d = e : 1 : 2.
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.seed = 9;
  Sampler s(o, 4);
  auto con = std::make_shared<GrammarConstraint>(g, vocab);
  s.set_constraint(con);
  std::map<int32_t, int> count;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[s.sample(logits)];
  EXPECT_EQ(count[0], 0);
  const double z = std::exp(1.0) + 1.0 + 2.0;
  EXPECT_NEAR(count[1] / double(n), std::exp(1.0) / z, 0.01);
  EXPECT_NEAR(count[2] / double(n), 1.0 / z, 0.01);
  EXPECT_NEAR(count[3] / double(n), 2.0 / z, 0.01);
  // Stuck: nothing allowed after the single character and no end token.
  s.accept(1);
  EXPECT_THROW(s.sample(logits), Error);
  EXPECT_THROW(s.accept(2), Error);
  // Unset: unconstrained again.
  s.set_constraint(nullptr);
  sg.set_constraint(nullptr);
  EXPECT_EQ(sg.sample(logits), 0);
}

}  // namespace
}  // namespace ebb::grammar
