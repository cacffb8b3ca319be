// The CLI's chat templates and output constraints (issue 37 outside the
// server): `ebb run --chat`, `ebb chat` and `ebb train`'s messages samples
// render through the GGUF's own Jinja template (--chat-template FILE|NAME
// overrides it; the marker renderer is a noted fallback), and
// `ebb run --grammar/--json-schema/--json` constrain the output.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "model/chat_renderer.h"
#include "model/gguf.h"
#include "runtime/engine.h"
#include "support.h"
#include "train/train_data.h"

namespace ebb {
namespace {

using test::CliResult;
using test::run_cli;

std::string stories() { return test::model_path("stories260K.gguf"); }
std::string qwen3_template() { return test::shared_path("golden/templates/Qwen-Qwen3-0.6B.jinja"); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// stories260K with `tmpl` as its tokenizer.chat_template.
std::string model_with_template(const test::TempDir& d, const std::string& tmpl) {
  const std::string path = d.file("with-template.gguf");
  auto src = GgufFile::open(stories());
  GgufWriter w;
  for (const auto& [key, value] : src->metadata()) w.set(key, value);
  w.set_string("tokenizer.chat_template", tmpl);
  std::vector<const GgufTensorInfo*> infos;
  for (const GgufTensorInfo& t : src->tensors()) {
    w.add_tensor(t.name, t.dims, t.type);
    infos.push_back(&t);
  }
  w.write(path, [&](size_t i, uint8_t* dst) { src->read(infos[i]->file_offset, dst, infos[i]->n_bytes); });
  return path;
}

// The summary line's "prompt N tok" and "hash H".
std::string prompt_tokens(const std::string& err) {
  std::smatch m;
  return std::regex_search(err, m, std::regex(R"(prompt (\d+) tok)")) ? m[1].str() : "";
}
std::string output_hash(const std::string& err) {
  std::smatch m;
  return std::regex_search(err, m, std::regex(R"(hash ([0-9a-f]+))")) ? m[1].str() : "";
}

// A Jinja template that renders exactly what the plain marker format does.
constexpr const char* kPlainAsJinja =
    "{% for m in messages %}{% if m.role == 'system' %}System: {{ m.content | trim }}\n"
    "{% elif m.role == 'user' %}User: {{ m.content | trim }}\n"
    "{% else %}Assistant: {{ m.content | trim }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}";

TEST(CliJinja, RunChatRendersTheModelsOwnTemplate) {
  test::TempDir d("ebb-jinja");
  const std::string args = " -p 'Where is Lily?' --chat --temp 0 -n 12 --threads 1";
  // The GGUF's template, rendering the plain format's text: the same prompt
  // and the same answer as the marker renderer.
  const CliResult jinja = run_cli("run -m " + model_with_template(d, kPlainAsJinja) + args);
  ASSERT_EQ(jinja.status, 0) << jinja.err;
  EXPECT_EQ(jinja.err.find("marker format"), std::string::npos) << jinja.err;  // no fallback note
  const CliResult plain = run_cli("run -m " + stories() + args + " --format plain");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(jinja.out, plain.out);
  EXPECT_EQ(output_hash(jinja.err), output_hash(plain.err));
  EXPECT_FALSE(output_hash(jinja.err).empty()) << jinja.err;

  // The template runs (not recognised by markers): one that raises says so.
  const CliResult raised =
      run_cli("run -m " + model_with_template(d, "{{ raise_exception('only tools here') }}") + args);
  EXPECT_EQ(raised.status, 1) << raised.err;
  EXPECT_NE(raised.err.find("only tools here"), std::string::npos) << raised.err;

  // A file without a template: the marker renderer, said in one line.
  const CliResult fallback = run_cli("run -m " + stories() + args);
  ASSERT_EQ(fallback.status, 0) << fallback.err;
  EXPECT_NE(fallback.err.find("note: the model has no chat template: prompts use the plain marker format"),
            std::string::npos)
      << fallback.err;
  EXPECT_EQ(fallback.out, plain.out);
}

TEST(CliJinja, ChatTemplateFileOverridesTheModels) {
  test::TempDir d("ebb-jinja");
  const std::string model = model_with_template(d, "{{ raise_exception('the GGUF template ran') }}");
  const std::string args = " -p 'Where is Lily?' --chat --temp 0 -n 12 --threads 1";
  // Qwen3's real template from a file, instead of the model's (which raises).
  const CliResult q = run_cli("run -m " + model + args + " --chat-template " + qwen3_template() + " --jinja");
  ASSERT_EQ(q.status, 0) << q.err;
  // "<|im_start|>user\nWhere is Lily?<|im_end|>\n<|im_start|>assistant\n", spelled
  // in stories260K's pieces: many more tokens than the plain format's.
  const CliResult plain = run_cli("run -m " + model + args + " --chat-template plain");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_GT(std::stoi(prompt_tokens(q.err)), std::stoi(prompt_tokens(plain.err)) + 10) << q.err << plain.err;
  // A template file that does not parse: exit 2 naming the file and the line.
  std::ofstream(d.file("bad.jinja")) << "line one\n{% for m in messages %}{{ m.content }\n";
  const CliResult bad = run_cli("run -m " + model + args + " --chat-template " + d.file("bad.jinja"));
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_NE(bad.err.find(d.file("bad.jinja")), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("line 2"), std::string::npos) << bad.err;
}

TEST(CliJinja, ChatSaysTheTemplateItRuns) {
  test::TempDir d("ebb-jinja");
  const CliResult r = run_cli("chat -m " + model_with_template(d, kPlainAsJinja) + " --threads 1 --temp 0 -n 6",
                              "Hello\n/quit\n");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("chat template: jinja (the model's tokenizer.chat_template)"), std::string::npos) << r.err;
  const CliResult q = run_cli("chat -m " + stories() + " --threads 1 --temp 0 -n 6 --chat-template " +
                                  qwen3_template(),
                              "Hello\nAgain\n/quit\n");
  ASSERT_EQ(q.status, 0) << q.err;
  EXPECT_NE(q.err.find("chat template: jinja (" + qwen3_template() + ")"), std::string::npos) << q.err;
}

// Training on a "messages" line through Qwen3's real template: exactly each
// assistant turn's text and its <|im_end|> weigh 1 -- for the last answer
// too, which Qwen3 renders with an empty <think> block, and the earlier
// one, which it renders without.
TEST(TrainJinja, AssistantTurnsAreTheWeightedTokens) {
  test::TempDir d("ebb-jinja");
  const std::string data = d.file("chat.jsonl");
  std::ofstream(data) << R"({"messages": [{"role": "system", "content": "Be brief."}, )"
                         R"({"role": "user", "content": "Who is Lily?"}, {"role": "assistant", "content": "A girl."}, )"
                         R"({"role": "user", "content": "And Tom?"}, {"role": "assistant", "content": "Her dog."}]})"
                      << "\n";
  EngineOptions eo;
  eo.model_path = stories();
  eo.n_threads = 1;
  Engine engine(eo);
  const Tokenizer& tok = engine.tokenizer();
  TrainDataOptions dop;
  dop.renderer = std::make_shared<const ChatRenderer>(
      ChatRenderer::from_source(read_file(qwen3_template()), "qwen3", tok));
  const std::vector<TrainSample> s = load_train_data(data, tok, dop);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_EQ(s[0].tokens.size(), s[0].weights.size());
  // The weighted runs, as text.
  std::vector<std::string> runs;
  bool in = false;
  for (size_t i = 0; i < s[0].tokens.size(); ++i) {
    if (s[0].weights[i] > 0 && !in) runs.emplace_back();
    in = s[0].weights[i] > 0;
    if (in) runs.back() += tok.token_to_piece(s[0].tokens[i], true);
  }
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0], "A girl.<|im_end|>");
  EXPECT_EQ(runs[1], "<think>\n\n</think>\n\nHer dog.<|im_end|>");
  // The whole text is Qwen3's rendering.
  std::string all;
  for (int32_t t : s[0].tokens) all += tok.token_to_piece(t, true);
  EXPECT_NE(all.find("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho is Lily?<|im_end|>\n"
                     "<|im_start|>assistant\nA girl.<|im_end|>\n"),
            std::string::npos)
      << all;
}

TEST(TrainJinja, CliTrainsOnMessagesThroughATemplateFile) {
  test::TempDir d("ebb-jinja");
  const std::string data = d.file("chat.jsonl");
  std::ofstream(data) << R"({"messages": [{"role": "user", "content": "Who is Lily?"}, )"
                         R"({"role": "assistant", "content": "A girl."}]})"
                      << "\n";
  const std::string base = "train -m " + stories() + " --data " + data + " --steps 1 --threads 1 -o " +
                           d.file("a.gguf");
  const CliResult r = run_cli(base + " --chat-template " + qwen3_template());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("marker format"), std::string::npos) << r.err;
  // Without a template in the file: the marker format, noted with the line.
  const CliResult m = run_cli(base);
  ASSERT_EQ(m.status, 0) << m.err;
  EXPECT_NE(m.err.find(data + ":1: \"messages\" are rendered with the plain marker format"), std::string::npos)
      << m.err;
}

// ---- ebb run --grammar / --json-schema / --json ----

TEST(CliGrammar, JsonSchemaConstrainsTheOutput) {
  test::TempDir d("ebb-grammar");
  std::ofstream(d.file("s.json"))
      << R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},)"
         R"( "age": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["name", "age"],)"
         R"( "additionalProperties": false})";
  for (int seed = 1; seed <= 3; ++seed) {
    const CliResult r = run_cli("run -m " + stories() + " -p Lily -n 64 --threads 1 --temp 1 --seed " +
                                std::to_string(seed) + " --json-schema " + d.file("s.json"));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("stop eog"), std::string::npos) << "the grammar completes the object: " << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);  // throws (fails) when not JSON
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j.size(), 2u) << r.out;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << r.out;
    EXPECT_LE(j["name"].get<std::string>().size(), 8u) << r.out;
    ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << r.out;
    EXPECT_GE(j["age"].get<int>(), 0);
    EXPECT_LE(j["age"].get<int>(), 99);
  }
  // --json: any object, inline schema text as llama.cpp's -j takes it.
  const CliResult any = run_cli("run -m " + stories() + " -p Lily -n 200 --threads 1 --seed 4 --json");
  ASSERT_EQ(any.status, 0) << any.err;
  EXPECT_EQ(any.out[0], '{') << any.out;
  const CliResult inl = run_cli("run -m " + stories() + " -p Lily -n 40 --threads 1 --seed 4 -j " +
                                "'{\"type\": \"array\", \"items\": {\"enum\": [\"cat\", \"dog\"]}, \"maxItems\": 3}'");
  ASSERT_EQ(inl.status, 0) << inl.err;
  const nlohmann::json arr = nlohmann::json::parse(inl.out);
  ASSERT_TRUE(arr.is_array()) << inl.out;
  EXPECT_LE(arr.size(), 3u);
  for (const auto& x : arr) EXPECT_TRUE(x == "cat" || x == "dog") << inl.out;
}

TEST(CliGrammar, GbnfConstrainsTheOutput) {
  test::TempDir d("ebb-grammar");
  std::ofstream(d.file("g.gbnf")) << "# a yes/no answer, then a number\nroot ::= (\"yes\" | \"no\") \" \" [0-9]{1,3}\n";
  for (int seed = 1; seed <= 3; ++seed) {
    const CliResult r = run_cli("run -m " + stories() + " -p Lily -n 20 --threads 1 --temp 1.5 --seed " +
                                std::to_string(seed) + " --grammar " + d.file("g.gbnf"));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(std::regex_match(r.out, std::regex("(yes|no) [0-9]{1,3}\n"))) << r.out;
  }
}

TEST(CliGrammar, BadGrammarOrSchemaNamesFileLineAndWhy) {
  test::TempDir d("ebb-grammar");
  const std::string run = "run -m " + stories() + " -p Lily -n 4 --threads 1 ";
  std::ofstream(d.file("bad.gbnf")) << "root ::= answer\nanswer ::= \"yes\" | nope\n";
  CliResult r = run_cli(run + "--grammar " + d.file("bad.gbnf"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find(d.file("bad.gbnf")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("undefined rule 'nope'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");

  std::ofstream(d.file("bad.json")) << "{\"type\": \"object\",\n \"properties\": {,}}";
  r = run_cli(run + "--json-schema " + d.file("bad.json"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find(d.file("bad.json")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line 2, column 17"), std::string::npos) << r.err;

  std::ofstream(d.file("wrong.json")) << R"({"type": "object", "properties": {"a": {"type": "strin"}}})";
  r = run_cli(run + "--json-schema " + d.file("wrong.json"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("#/properties/a"), std::string::npos) << r.err;

  r = run_cli(run + "--json-schema " + d.file("missing.json"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("missing.json': cannot read the file (it does not exist)"), std::string::npos) << r.err;
  // A hostile file's error stays one short line (a 100,000-byte rule name).
  std::ofstream(d.file("long.gbnf")) << std::string(100000, 'a') << "\n";
  r = run_cli(run + "--grammar " + d.file("long.gbnf"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("more bytes)"), std::string::npos) << r.err.substr(0, 500);
  EXPECT_LT(r.err.size(), 1000u);

  r = run_cli(run + "--json --grammar " + d.file("bad.gbnf"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("not several"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ebb

namespace ebb {
namespace {

// ebb bench grammar on a tiny model: the JSON carries both decode rates, the
// ratio and its bound, and the first token's compile and mask times for the
// schema and the tools (a forced call).
TEST(BenchGrammar, JsonHasDecodeRatioAndFirstTokenFigures) {
  test::TempDir d("ebb-bench-grammar");
  std::ofstream(d.file("s.json")) << R"({"type": "object", "properties": {"note": {"type": "string", "maxLength": 30}},)"
                                     R"( "required": ["note"]})";
  std::ofstream(d.file("tools.json"))
      << R"([{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties":)"
         R"( {"x": {"type": "integer"}}, "required": ["x"]}}}, {"type": "function", "function": {"name": "b",)"
         R"( "parameters": {"type": "object", "properties": {}}}}])";
  const CliResult r = run_cli("bench grammar -m " + stories() + " --schema " + d.file("s.json") + " --tools " +
                              d.file("tools.json") + " -n 12 --reps 2 --threads 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto& dec = j.at("decode");
  EXPECT_GT(dec.at("unconstrained_tok_s").get<double>(), 0);
  EXPECT_GT(dec.at("schema_tok_s").get<double>(), 0);
  EXPECT_NEAR(dec.at("schema_ratio").get<double>(),
              dec.at("schema_tok_s").get<double>() / dec.at("unconstrained_tok_s").get<double>(), 1e-9);
  EXPECT_EQ(dec.at("bound_ratio").get<double>(), 1.0);
  EXPECT_GT(dec.at("tools_tok_s").get<double>(), 0);
  EXPECT_GT(dec.at("schema_paired_ratio").get<double>(), 0);
  // The mask's replayed cost, and the ratio it allows: step / (step + mask).
  const double mask_us = dec.at("schema_mask_us_per_token").get<double>();
  EXPECT_GT(mask_us, 0);
  EXPECT_LE(mask_us, dec.at("schema_mask_us_max").get<double>());
  const double step_us = 1e6 / dec.at("unconstrained_tok_s").get<double>();
  EXPECT_NEAR(dec.at("schema_mask_ratio").get<double>(), step_us / (step_us + mask_us), 1e-9);
  const auto& ft = j.at("first_token");
  EXPECT_GT(ft.at("schema_compile_ms").get<double>(), 0);
  EXPECT_GE(ft.at("schema_first_mask_ms").get<double>(), 0);
  EXPECT_GE(ft.at("schema_first_mask_allowed").get<double>(), 1);  // '{' at least
  EXPECT_EQ(ft.at("tools").get<int>(), 2);
  EXPECT_GT(ft.at("tools_compile_ms").get<double>(), 0);
  // A bad schema names the file.
  std::ofstream(d.file("bad.json")) << R"({"type": "strin"})";
  const CliResult bad = run_cli("bench grammar -m " + stories() + " --schema " + d.file("bad.json") + " --threads 1");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find(d.file("bad.json")), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace ebb
