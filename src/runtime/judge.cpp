// The judge prompt as background inference (judge.h).
#include "runtime/judge.h"

#include <cctype>
#include <cstdlib>

#include "platform/error.h"
#include "runtime/generate.h"
#include "runtime/grammar/constraint.h"

namespace ebb {

namespace {

// Renders (out non-null) or only checks the template.
void render(const std::string& tmpl, const std::string* prompt, const std::string* response,
            const std::string* feedback, std::string* out) {
  for (size_t i = 0; i < tmpl.size(); ++i) {
    const char c = tmpl[i];
    if (c == '}') {
      if (i + 1 < tmpl.size() && tmpl[i + 1] == '}') {
        if (out) *out += '}';
        ++i;
        continue;
      }
      throw Error("the judge prompt has a '}' at byte " + std::to_string(i) + " that closes nothing (write '}}' for '}')");
    }
    if (c != '{') {
      if (out) *out += c;
      continue;
    }
    if (i + 1 < tmpl.size() && tmpl[i + 1] == '{') {
      if (out) *out += '{';
      ++i;
      continue;
    }
    const size_t end = tmpl.find('}', i);
    if (end == std::string::npos)
      throw Error("the judge prompt has a '{' at byte " + std::to_string(i) + " that is never closed (write '{{' for '{')");
    const std::string name = tmpl.substr(i + 1, end - i - 1);
    const std::string* v = name == "prompt" ? prompt : name == "response" ? response : name == "feedback" ? feedback : nullptr;
    if (name != "prompt" && name != "response" && name != "feedback")
      throw Error("the judge prompt names '{" + name + "}': the placeholders are {prompt}, {response} and {feedback}");
    if (out && v) *out += *v;
    i = end;
  }
}

}  // namespace

std::string render_judge_prompt(const std::string& tmpl, const std::string& prompt, const std::string& response,
                                const std::string& feedback) {
  std::string out;
  render(tmpl, &prompt, &response, &feedback, &out);
  return out;
}

void check_judge_template(const std::string& tmpl) { render(tmpl, nullptr, nullptr, nullptr, nullptr); }

std::optional<double> parse_judge_score(const std::string& answer) {
  size_t i = 0;
  while (i < answer.size() && std::isspace(static_cast<unsigned char>(answer[i]))) ++i;
  size_t end = i;
  while (end < answer.size() && std::isalnum(static_cast<unsigned char>(answer[end]))) ++end;
  std::string word = answer.substr(i, end - i);
  if (word.empty()) return std::nullopt;
  // What may follow the word: the end, space, or punctuation that ends it
  // ("7/10", "yes." "8,"), but not more of a number ("7.5" is not 7).
  if (end < answer.size() && answer[end] == '.' && end + 1 < answer.size() &&
      std::isdigit(static_cast<unsigned char>(answer[end + 1])))
    return std::nullopt;
  for (char& ch : word) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (word == "yes") return 1.0;
  if (word == "no") return -1.0;
  if (word.size() > 2) return std::nullopt;
  for (char ch : word)
    if (!std::isdigit(static_cast<unsigned char>(ch))) return std::nullopt;
  const int n = std::atoi(word.c_str());
  if (n > 10) return std::nullopt;
  return (n - 5) / 5.0;
}

Task judge_task(Engine& engine, JudgeCall call, std::function<void(JudgeResult)> done, const Scheduler* sched) {
  if (call.prompt.empty()) throw Error("a judge call needs a prompt");
  if (call.max_tokens < 1) throw Error("a judge call needs max_tokens >= 1");
  if (call.grammar && !call.vocab) throw Error("a judge call with a grammar needs the vocabulary's trie");
  // What the steps share; the session and generation are made on the
  // scheduler thread at the first step (they run the engine).
  struct Run {
    JudgeCall call;
    std::unique_ptr<Session> session;
    std::unique_ptr<Generation> gen;
    JudgeResult result;
    std::function<void(JudgeResult)> done;
  };
  auto run = std::make_shared<Run>();
  run->call = std::move(call);
  run->done = std::move(done);
  Task t;
  t.desc.kind = "judge";
  t.desc.priority = run->call.priority;
  t.desc.adapter = run->call.adapter;
  t.step = [&engine, run, sched] {
    JudgeResult& r = run->result;
    if (!run->gen) {
      if (sched) {
        const SchedulerMetrics m = sched->metrics();
        r.fg_active_at_start = m.fg_waiting + m.fg_running;
        r.fg_completed_at_start = m.fg_completed;
      }
      SessionOptions so;
      so.n_ctx = static_cast<int64_t>(run->call.prompt.size()) + run->call.max_tokens + 1;
      so.use_prefix_cache = false;  // a judge's prompt is its own; nothing of it is reused
      run->session = std::make_unique<Session>(engine, so);
      if (!run->call.adapter.empty()) run->session->set_adapters({{run->call.adapter, 1.0f, 0}});
      GenerateOptions go;
      go.max_tokens = run->call.max_tokens;
      go.sampling.temperature = 0;  // greedy: the same answer for the same prompt
      go.sampling.seed = 1;
      if (run->call.grammar)
        go.constraint = std::make_shared<grammar::GrammarConstraint>(run->call.grammar, run->call.vocab);
      run->gen = std::make_unique<Generation>(*run->session, run->call.prompt, go,
                                              [run](std::string_view text) {
                                                run->result.answer += text;
                                                return true;
                                              });
    }
    ++r.steps;
    const bool more = run->gen->step();
    if (r.adapter_version == 0)
      for (const ActiveAdapter& a : run->session->adapters()) r.adapter_version = a.v->version;
    return more;
  };
  t.on_done = [run](TaskOutcome outcome, const std::string& error) {
    JudgeResult r = std::move(run->result);
    if (outcome == TaskOutcome::kCompleted) {
      r.ran = true;
      r.reward = parse_judge_score(r.answer);
    } else {
      r.error = outcome == TaskOutcome::kCancelled ? "the judge call was cancelled" : "the judge call failed: " + error;
    }
    run->gen.reset();
    run->session.reset();
    if (run->done) run->done(std::move(r));
  };
  return t;
}

}  // namespace ebb
