// The command line as llama.cpp and Ollama users type it: llama.cpp's
// spellings accepted (and those ebb has no use for noted), typos answered
// with the closest option, `ebb help`, help grouped by what matters, input
// bounded by what the context can use, threads capped, load progress.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "model/gguf.h"
#include "support.h"

namespace ebb {
namespace {

using test::run_cli;
using Result = test::CliResult;

std::string stories() { return test::model_path("stories260K.gguf"); }

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = 0; (at = s.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

// ---- item 1: input bounded by the context ----

TEST(CliBoundedInput, APromptFileLargerThanTheContextIsRefusedWithoutReadingIt) {
  // /dev/zero never ends: reading stops at 64 bytes per context token.
  const auto t0 = std::chrono::steady_clock::now();
  const Result file = run_cli("run -m " + stories() + " --ctx 64 -n 1 --threads 1 -f /dev/zero");
  EXPECT_EQ(file.status, 1) << file.err;
  EXPECT_NE(file.err.find("the prompt file is larger than the context can hold"), std::string::npos) << file.err;
  EXPECT_NE(file.err.find("4.0 KiB"), std::string::npos) << file.err;  // 64 tokens x 64 bytes
  // Standard input the same (the inner redirection wins over run_cli's own).
  const Result in = run_cli("--help >/dev/null; { " + std::string(EBB_CLI_PATH) + " run -m " + stories() +
                            " --ctx 64 -n 1 --threads 1 -f - </dev/zero; }");
  EXPECT_EQ(in.status, 1) << in.err;
  EXPECT_NE(in.err.find("'-': the prompt file is larger than the context can hold"), std::string::npos) << in.err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  // A file within the bound runs.
  test::TempDir d("ebb-cli");
  std::ofstream(d.file("p.txt")) << "Once upon a time";
  const Result ok = run_cli("run -m " + stories() + " --ctx 64 -n 2 --temp 0 --threads 1 -f " + d.file("p.txt"));
  EXPECT_EQ(ok.status, 0) << ok.err;
}

TEST(CliBoundedInput, ThreadsBeyondTheHardwareAreCapped) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const Result r = run_cli("run -m " + stories() + " -p Lily --temp 0 -n 2 -t 1000");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("note: --threads 1000 is more than the " + std::to_string(hw) + " hardware threads; using " +
                       std::to_string(hw)),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(" x" + std::to_string(hw) + " |"), std::string::npos) << r.err;  // the pool has hw threads
}

// ---- item 2: options ----

TEST(CliOptions, TyposGetTheClosestOption) {
  const std::string m = "run -m " + stories() + " -p hi ";
  Result r = run_cli(m + "--temperature 0.5");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("ebb run has no option --temperature; did you mean --temp?"), std::string::npos) << r.err;
  r = run_cli(m + "--thread 2");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("did you mean --threads?"), std::string::npos) << r.err;
  r = run_cli(m + "--top_k 5");
  EXPECT_NE(r.err.find("did you mean --top-k?"), std::string::npos) << r.err;
  r = run_cli("train -m " + stories() + " --data x -o y --learning-rat 1e-3");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("ebb train has no option --learning-rat"), std::string::npos) << r.err;
  r = run_cli("rnu -m " + stories());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("'rnu' is not a subcommand of ebb (did you mean run?)"), std::string::npos) << r.err;
  // Nothing close: no guess.
  r = run_cli(m + "--qqqqqqqq");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("has no option --qqqqqqqq (see ebb run --help)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("did you mean"), std::string::npos) << r.err;
}

// -r is the reverse prompt (run, chat) and nothing else: train spells its
// rank --rank, the benchmarks their repetitions --reps (a -r there is
// pointed to it).
TEST(CliOptions, ShortRIsNotRepsInBench) {
  Result r = run_cli("bench speed -m " + stories() + " -p 8 -n 2 -r 1 --membw-mib 0");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("ebb bench speed has no option -r; did you mean --reps?"), std::string::npos) << r.err;
  r = run_cli("bench speed -m " + stories() + " -p 8 -n 2 --reps 1 -t 1 --membw-mib 0");
  EXPECT_EQ(r.status, 0) << r.err;
  for (const char* sub : {"bench ttft", "bench budget", "bench batch", "bench serve", "bench prefix", "bench train",
                          "bench kvcodec"}) {
    const Result h = run_cli(std::string(sub) + " --help");
    EXPECT_EQ(h.status, 0) << sub << h.err;
    EXPECT_NE(h.out.find("--reps"), std::string::npos) << sub;
    EXPECT_EQ(h.out.find("-r,"), std::string::npos) << sub << h.out;
  }
  const Result train = run_cli("train --help");
  EXPECT_NE(train.out.find("--rank"), std::string::npos) << train.out;
  EXPECT_EQ(train.out.find("-r,"), std::string::npos) << train.out;
  const Result run = run_cli("run --help");
  EXPECT_TRUE(std::regex_search(run.out, std::regex(R"(-r,\s*--reverse-prompt)"))) << run.out;
}

TEST(CliOptions, HelpSubcommandAndGroups) {
  const Result top = run_cli("help");
  ASSERT_EQ(top.status, 0) << top.err;
  EXPECT_NE(top.out.find("Short options mean the same in every subcommand"), std::string::npos) << top.out;
  EXPECT_NE(top.out.find("run"), std::string::npos);
  const Result run = run_cli("help run");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.out, run_cli("run --help").out);
  // Common options first, the engine's in a group of their own after them.
  const size_t prompt = run.out.find("--prompt"), engine = run.out.find("Engine, memory and cache options"),
               budget = run.out.find("--memory-budget");
  ASSERT_NE(prompt, std::string::npos) << run.out;
  ASSERT_NE(engine, std::string::npos) << run.out;
  EXPECT_LT(prompt, engine) << run.out;
  EXPECT_LT(engine, budget) << run.out;
  EXPECT_NE(run.out.find("-r,--reverse-prompt"), std::string::npos) << run.out;
  // train lists only what works in train; -r is not its rank.
  const Result train = run_cli("help train");
  ASSERT_EQ(train.status, 0) << train.err;
  for (const char* absent : {"--prefix-cache", "--overlap", "--kv-codec", "--memory-budget", "-r,", "--batch INT"})
    EXPECT_EQ(train.out.find(absent), std::string::npos) << absent << "\n" << train.out;
  for (const char* present : {"--rank", "--epochs", "--eval", "--plot", "--log", "--batch-size", "--memory-limit"})
    EXPECT_NE(train.out.find(present), std::string::npos) << present << "\n" << train.out;
  EXPECT_EQ(run_cli("help nosuch").status, 2);
}

TEST(CliOptions, LlamaCppSpellingsWorkOrAreNoted) {
  const std::string m = "run -m " + stories() + " -p Lily --temp 0 -n 6 --threads 1 ";
  const Result base = run_cli(m);
  ASSERT_EQ(base.status, 0) << base.err;
  struct Case {
    std::string args, note;
  } cases[] = {
      {"-fa", "-fa/--flash-attn is ignored"},
      {"-fa on", "-fa/--flash-attn is ignored"},
      {"--flash-attn auto", "-fa/--flash-attn is ignored"},
      {"--mlock", "--mlock is ignored"},
      {"--no-mmap", "--no-mmap is ignored"},
      {"--jinja", ""},  // no template here: nothing to say
      {"--keep 4", "--keep is ignored"},
      {"-b 32", ""},
      {"--batch-size 16", ""},
      {"--repeat-last-n 32", ""},
      {"-v", "config: "},
  };
  for (const Case& c : cases) {
    const Result r = run_cli(m + c.args);
    EXPECT_EQ(r.status, 0) << c.args << ": " << r.err;
    EXPECT_EQ(r.out, base.out) << c.args;
    if (!c.note.empty()) {
      EXPECT_EQ(count(r.err, c.note), 1u) << c.args << ": " << r.err;
    }
  }
  // --jinja with a chat template in use is noted once.
  const Result j = run_cli(m + "--chat --jinja");
  EXPECT_EQ(j.status, 0) << j.err;
  EXPECT_EQ(count(j.err, "--jinja is implied"), 1u) << j.err;
  // The prompt text "on" is not taken by -fa when it is an option's value.
  const Result fa = run_cli("run -m " + stories() + " -fa -p on --temp 0 -n 2 --threads 1");
  EXPECT_EQ(fa.status, 0) << fa.err;
}

// --device and -ngl: contradictions are usage errors before the load, an
// absent device an error naming it (in every build: without Vulkan the
// registry says the build has none), never a silent run on the CPU.
TEST(CliOptions, DeviceAndNglAreChecked) {
  const std::string m = "run -m " + stories() + " -p Lily --temp 0 -n 2 --threads 1 ";
  struct Case {
    std::string args;
    int status;
    std::string says;
  } cases[] = {
      {"--device cpu -ngl 4", 2, "--device cpu asks for none"},
      {"--device vulkan -ngl 0", 2, "-ngl 0 puts no layer on the device"},
      {"--device tpu", 2, "--device 'tpu' is not one of cpu, vulkan, vulkan:N"},
      {"-ngl -2", 2, "must be >= 0"},
      {"-ngl lots", 2, "or auto"},
      {"-ngl 2 --device-memory 1G", 2, "fixes the layers"},
      {"--device cpu --device-memory 1G", 2, "applies to a device"},
      {"--device vulkan --device-memory 10%", 2, "not a percentage"},
      {"--device vulkan:7", 1, "vulkan:7"},
  };
  for (const Case& c : cases) {
    const Result r = run_cli(m + c.args);
    EXPECT_EQ(r.status, c.status) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
  const Result base = run_cli(m), cpu = run_cli(m + "--device cpu -ngl 0");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  EXPECT_EQ(cpu.out, base.out);
}

TEST(CliOptions, ReversePromptStopsTheText) {
  const auto golden = test::load_golden("stories260K");
  const std::string text = golden[0].greedy_text;
  // A word from the middle of the greedy continuation: the run stops before it.
  const size_t at = text.find(' ', text.size() / 2);
  ASSERT_NE(at, std::string::npos);
  const size_t end = text.find(' ', at + 1);
  const std::string word = text.substr(at, end - at);
  const size_t first = text.find(word);
  const std::string m = "run -m " + stories() + " -p \"Once upon a time\" -n 48 --temp 0 --threads 1 ";
  for (const std::string& flag : {"-r", "--reverse-prompt"}) {
    const Result r = run_cli(m + flag + " \"" + word + "\"");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, text.substr(0, first) + "\n") << flag << " '" << word << "'";
    EXPECT_NE(r.err.find("stop stop_string"), std::string::npos) << r.err;
  }
}

TEST(CliOptions, EscapesInThePrompt) {
  // tiny-qwen3 (byte-level BPE, random weights) answers a newline and a
  // backslash-n differently; -e turns the two characters into the newline.
  test::TempDir d("ebb-cli");
  std::ofstream(d.file("nl.txt")) << "Once upon a time\nthere was";
  std::ofstream(d.file("bs.txt")) << "Once upon a time\\nthere was";
  const std::string m = "run -m " + test::model_path("tiny-qwen3-f16.gguf") + " -n 12 --temp 0 --threads 1 ";
  const Result nl = run_cli(m + "-f " + d.file("nl.txt")), bs = run_cli(m + "-f " + d.file("bs.txt"));
  ASSERT_EQ(nl.status, 0) << nl.err;
  ASSERT_NE(nl.out, bs.out) << "the model does not tell the two prompts apart";
  const Result escaped = run_cli(m + "-e -p 'Once upon a time\\nthere was'");
  const Result raw = run_cli(m + "-p 'Once upon a time\\nthere was'");
  ASSERT_EQ(escaped.status, 0) << escaped.err;
  EXPECT_EQ(escaped.out, nl.out);
  EXPECT_EQ(raw.out, bs.out);
}

TEST(CliOptions, ChatTemplateByNameOrFile) {
  test::TempDir d("ebb-cli");
  // A Jinja template file (ChatML-shaped): chat runs it.
  std::ofstream(d.file("t.jinja"))
      << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  const std::string m = "chat -m " + stories() + " --threads 1 ";
  Result r = run_cli(m + "--chat-template " + d.file("t.jinja"), "/quit\n");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("chat template: jinja (" + d.file("t.jinja") + ")"), std::string::npos) << r.err;
  r = run_cli(m + "--chat-template llama3", "/quit\n");
  EXPECT_NE(r.err.find("chat template: llama3"), std::string::npos) << r.err;
  r = run_cli(m + "--chat-template " + d.file("missing.jinja"), "/quit\n");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("neither a format"), std::string::npos) << r.err;
}

// ---- item 3: load progress ----

TEST(CliProgress, PlainLinesWhenNotATerminalNothingWhenQuiet) {
  // --progress-after 0 shows the progress of even this small load.
  const std::string m = "run -m " + stories() + " -p Lily --temp 0 -n 2 --threads 1 --progress-after 0";
  const Result r = run_cli(m);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(loading stories260K\.gguf: 100% \(([0-9.]+)/\1 MB\)\n)"))) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no carriage returns off a terminal";
  const Result q = run_cli(m + " -q");
  ASSERT_EQ(q.status, 0) << q.err;
  EXPECT_EQ(q.err, "") << q.err;
  EXPECT_EQ(q.out, r.out);
  // By default a load under a second shows nothing.
  const Result quick = run_cli("run -m " + stories() + " -p Lily --temp 0 -n 2 --threads 1");
  EXPECT_EQ(quick.err.find("loading "), std::string::npos) << quick.err;
}

TEST(CliProgress, ContextBeyondTrainingWarns) {
  const Result r = run_cli("run -m " + stories() + " -p Lily --temp 0 -n 2 --threads 1 -c 100000");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(warning: --ctx 100000 is beyond the \d+ tokens)"))) << r.err;
}

// ---- item 6: inspect ----

// stories260K with a chat template of 9 lines written into its metadata.
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

TEST(CliInspectOrder, SummaryFirstThenTensorsAndTheChatTemplate) {
  test::TempDir d("ebb-cli");
  std::string tmpl;
  for (int i = 1; i <= 9; ++i) tmpl += "{# line " + std::to_string(i) + " #}\n";
  tmpl += "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}";
  const Result r = run_cli("inspect " + model_with_template(d, tmpl));
  ASSERT_EQ(r.status, 0) << r.err;
  const size_t params = r.out.find("parameters:"), kv = r.out.find("KV per 1k tokens"),
               shown = r.out.find("chat template: "), meta = r.out.find("\nmetadata:"), tensors = r.out.find("\ntensors:");
  ASSERT_NE(tensors, std::string::npos) << r.out;
  EXPECT_LT(params, kv);
  EXPECT_LT(kv, shown);
  EXPECT_LT(shown, meta);
  EXPECT_LT(meta, tensors);
  EXPECT_NE(r.out.find("chat template: " + std::to_string(tmpl.size()) + " characters, 10 lines"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  | {# line 1 #}\n"), std::string::npos) << r.out;  // the first lines
  EXPECT_NE(r.out.find("  | {# line 6 #}\n  | ... (4 more lines)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("  | {# line 7 #}"), std::string::npos) << r.out;
  const Result none = run_cli("inspect --no-tensors " + stories());
  EXPECT_NE(none.out.find("chat template: none"), std::string::npos) << none.out;
}

// -m means the model in every subcommand, inspect included; the positional
// still works, and no model or two different ones are clear errors.
TEST(CliInspectOrder, TheModelByPositionalOrByDashM) {
  const Result pos = run_cli("inspect --no-tensors " + stories());
  const Result flag = run_cli("inspect --no-tensors -m " + stories());
  ASSERT_EQ(pos.status, 0) << pos.err;
  ASSERT_EQ(flag.status, 0) << flag.err;
  EXPECT_EQ(pos.out, flag.out);
  const Result none = run_cli("inspect --no-tensors");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.err.find("ebb inspect needs a model"), std::string::npos) << none.err;
  const Result two = run_cli("inspect " + stories() + " -m " + test::model_path("tiny-qwen3-q4_0.gguf"));
  EXPECT_NE(two.status, 0);
  EXPECT_NE(two.err.find("two models given"), std::string::npos) << two.err;
}

// ebb serve --train-share: training's guaranteed share of the engine's
// time (scheduler test AGuaranteedShareHoldsWhileTheForegroundSaturatesTheEngine
// for what it does), checked at start.
TEST(CliOptions, ServeTrainShareIsAFraction) {
  for (const char* bad : {"-0.1", "1.5"}) {
    const Result r = run_cli("serve -m " + stories() + " --port 0 --train-share " + bad);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find("--train-share must be in [0, 1]"), std::string::npos) << r.err;
  }
}

// ebb serve --background-step: the length of one background step (the
// handoff and stale-prefill tests show what it does), at most W_bg.
TEST(CliOptions, ServeBackgroundStepFitsTheBackgroundWindow) {
  for (const char* bad : {"0", "-1", "0.6"}) {
    const Result r = run_cli("serve -m " + stories() + " --port 0 --background-window 0.5 --background-step " + bad);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find("--background-step must be in (0, --background-window]"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace ebb
