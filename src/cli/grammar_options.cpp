// --grammar FILE (GBNF), --json-schema FILE (JSON Schema) and --json: the
// output constraint of `ebb run` (and anything else that generates).
#include <filesystem>

#include "cli/options.h"
#include "platform/error.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_trie.h"

namespace ebb::cli {

void add_grammar_options(CLI::App* app, GrammarArgs& g) {
  const char* grp = "Output constraint";
  app->add_option("--grammar,--grammar-file", g.grammar_file,
                  "Constrain the output to a GBNF grammar (llama.cpp's format): a FILE, or the grammar's text")
      ->group(grp);
  app->add_option("-j,--json-schema,--json-schema-file", g.schema_file,
                  "Constrain the output to JSON valid for a JSON Schema: a FILE, or the schema's text")
      ->group(grp);
  app->add_flag("--json", g.json, "Constrain the output to a JSON object")->group(grp);
}

bool GrammarArgs::any() const { return !grammar_file.empty() || !schema_file.empty() || json; }

namespace {

// llama.cpp's --grammar and --json-schema take the text itself; ebb takes a
// file too. Text is told apart by its shape: a rule (::=), a JSON object.
bool grammar_is_text(const std::string& v) { return v.find("::=") != std::string::npos; }
bool schema_is_text(const std::string& v) {
  const size_t i = v.find_first_not_of(" \t\r\n");
  return i != std::string::npos && v[i] == '{';
}

}  // namespace

void check_grammar_args(const GrammarArgs& g) {
  const int n = !g.grammar_file.empty() + !g.schema_file.empty() + (g.json ? 1 : 0);
  if (n > 1) throw UsageError("give one of --grammar, --json-schema and --json, not several");
  for (const std::string* f : {&g.grammar_file, &g.schema_file}) {
    if (f->empty() || (f == &g.grammar_file ? grammar_is_text(*f) : schema_is_text(*f))) continue;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*f, ec))
      throw UsageError(std::string(f == &g.grammar_file ? "--grammar" : "--json-schema") + " '" + *f +
                       "': cannot read the file (" +
                       (std::filesystem::exists(*f, ec) ? "not a regular file" : "it does not exist") + ")");
  }
}

std::shared_ptr<const grammar::Grammar> output_grammar(const GrammarArgs& g) {
  if (!g.any()) return nullptr;
  check_grammar_args(g);
  constexpr uint64_t kMaxBytes = 4u << 20;  // GrammarLimits::max_text_bytes
  std::string gbnf;
  std::string what;  // the file (and option) errors name
  if (!g.grammar_file.empty()) {
    if (grammar_is_text(g.grammar_file)) {
      what = "--grammar (text)";
      gbnf = g.grammar_file;
    } else {
      what = "--grammar '" + g.grammar_file + "'";
      gbnf = read_bounded_text(g.grammar_file, kMaxBytes, "--grammar");
    }
  } else if (!g.schema_file.empty()) {
    const bool inline_text = schema_is_text(g.schema_file);
    what = inline_text ? "--json-schema (text)" : "--json-schema '" + g.schema_file + "'";
    const std::string text = inline_text ? g.schema_file : read_bounded_text(g.schema_file, kMaxBytes, "--json-schema");
    try {
      gbnf = grammar::json_schema_to_gbnf(std::string_view(text));
    } catch (const Error& e) {
      throw Error(what + ": " + e.what());
    }
  } else {
    what = "--json";
    gbnf = grammar::json_object_gbnf();
  }
  try {
    return grammar::Grammar::parse(gbnf);
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
}

std::shared_ptr<grammar::GrammarConstraint> output_constraint(std::shared_ptr<const grammar::Grammar> g,
                                                              const Tokenizer& tok) {
  if (!g) return nullptr;
  return std::make_shared<grammar::GrammarConstraint>(std::move(g), grammar::TokenTrie::from_tokenizer(tok));
}

}  // namespace ebb::cli
