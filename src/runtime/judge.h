// The judge prompt (LOCAL's judge calls; issue 38 part 4): feedback that
// carries no reward is turned into one by running a prompt through the
// model as background inference on the scheduler, and reading a score from
// its answer.
//
//   the prompt   a template (JudgeSpec::prompt) with {prompt} (the traced
//                turn's prompt, as text), {response} (its answer) and
//                {feedback} (the correction or comment the user gave);
//                "{{" and "}}" stand for "{" and "}"
//   the call     a Task of kind "judge", background class: each step() is
//                one step of a Generation (a prefill micro-batch or one
//                decode token), so a foreground arrival takes over at the
//                next step, and under the foreground-first policy the call
//                runs only when no foreground work waits or runs. Greedy
//                (temperature 0), at most JudgeSpec::max_tokens tokens,
//                under the judge's adapter (its published version, pinned
//                at the first step) when one is named, its answer
//                constrained by JudgeSpec::grammar when one is given
//   the score    parse_judge_score: the answer's first word, a number in
//                [0, 10] (reward (n - 5) / 5, so 0 → -1, 5 → 0, 10 → +1) or
//                yes / no (+1 / -1); anything else is unparseable: the call
//                is a judge failure and the feedback trains nothing
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/agents.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/token_trie.h"
#include "runtime/scheduler.h"

namespace ebb {

// The template with its placeholders filled in. Throws ebb::Error naming an
// unknown placeholder or an unmatched brace.
std::string render_judge_prompt(const std::string& tmpl, const std::string& prompt, const std::string& response,
                                 const std::string& feedback);
// Checks a template (render_judge_prompt's errors, without rendering).
void check_judge_template(const std::string& tmpl);

// The reward an answer gives (see above); nullopt when it has no score.
std::optional<double> parse_judge_score(const std::string& answer);

// One judge call, ready to run.
struct JudgeCall {
  std::vector<TokenId> prompt;                       // [n_prompt] the rendered template's tokens
  std::string adapter;                               // "" : the base model
  std::shared_ptr<const grammar::Grammar> grammar;   // null: the answer is free
  std::shared_ptr<const grammar::TokenTrie> vocab;   // with grammar: the vocabulary's trie
  int64_t max_tokens = 4;
  int priority = 0;                                  // the background task's
};

struct JudgeResult {
  bool ran = false;                // the generation ended (else `error` says why)
  std::string answer;              // the generated text
  std::optional<double> reward;    // parse_judge_score(answer)
  uint64_t adapter_version = 0;    // the judge adapter's version it ran under (0: base)
  int64_t steps = 0;               // scheduler steps it took
  // The scheduler's state when its first step ran (with a scheduler given):
  // foreground work waiting or running then (foreground-first: always 0),
  // and foreground requests completed by then.
  int64_t fg_active_at_start = -1, fg_completed_at_start = -1;
  std::string error;
};

// The call as a background task of kind "judge" over `engine` (the
// scheduler's). `done` runs once on the scheduler thread at the end with
// what came of it (a cancelled or failed task: ran false and the error).
// `sched` (optional): read at the first step for JudgeResult's scheduler
// fields.
Task judge_task(Engine& engine, JudgeCall call, std::function<void(JudgeResult)> done,
                const Scheduler* sched = nullptr);

}  // namespace ebb
