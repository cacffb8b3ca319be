// The learning loop's judge, samples and gate measure (learner.h).
#include "runtime/learner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "platform/error.h"
#include "runtime/session.h"

namespace ebb {

namespace {

std::string trim(std::string s) {
  const auto sp = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && sp(s.back())) s.pop_back();
  size_t i = 0;
  while (i < s.size() && sp(s[i])) ++i;
  return s.substr(i);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '\''; }

bool is_words(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!word_char(c) && c != ' ' && c != '-') return false;
  return word_char(s.front()) && word_char(s.back());
}

}  // namespace

std::optional<Rename> parse_rename(const std::string& correction) {
  std::string s = trim(correction);
  while (!s.empty() && (s.back() == '.' || s.back() == '!')) s.pop_back();
  std::string l = lower(s);
  if (l.rfind("call ", 0) == 0) {
    s = trim(s.substr(5));
    l = lower(s);
    for (const char* who : {"her ", "him ", "it ", "them ", "me "}) {
      if (l.rfind(who, 0) == 0) {
        s = trim(s.substr(std::string(who).size()));
        break;
      }
    }
  }
  const size_t comma = lower(s).rfind(", not ");
  if (comma == std::string::npos) return std::nullopt;
  Rename r{trim(s.substr(0, comma)), trim(s.substr(comma + 6))};
  if (!is_words(r.to) || !is_words(r.from) || r.to == r.from) return std::nullopt;
  return r;
}

std::optional<std::string> judge_correction(const std::string& response, const std::string& correction) {
  const std::optional<Rename> r = parse_rename(correction);
  if (!r) return correction;
  std::string out;
  bool replaced = false;
  for (size_t i = 0; i < response.size();) {
    const bool starts = response.compare(i, r->from.size(), r->from) == 0;
    const bool left = i == 0 || !word_char(response[i - 1]);
    const size_t end = i + r->from.size();
    const bool right = end >= response.size() || !word_char(response[end]) ||
                       response.compare(end, 2, "'s") == 0;  // "Lily's" is Lily too
    if (starts && left && right) {
      out += r->to;
      i = end;
      replaced = true;
    } else {
      out += response[i++];
    }
  }
  if (!replaced) return std::nullopt;
  return out;
}

LearnSample make_sample(std::string response_id, const std::vector<int32_t>& prompt, const std::vector<int32_t>& target,
                        double weight) {
  LearnSample s;
  s.response_id = std::move(response_id);
  s.weight = weight;
  s.sample.tokens = prompt;
  s.sample.tokens.insert(s.sample.tokens.end(), target.begin(), target.end());
  s.sample.weights.assign(prompt.size(), 0.0f);
  s.sample.weights.resize(s.sample.tokens.size(), static_cast<float>(weight));
  return s;
}

LossSum heldout_loss_sum(Engine& engine, const std::string& name, uint64_t version, const TrainSample& s) {
  LossSum out;
  if (s.tokens.size() < 2) return out;
  SessionOptions so;
  so.n_ctx = static_cast<int64_t>(s.tokens.size()) + 1;
  so.use_prefix_cache = false;  // every row's logits computed here, nothing shared
  Session session(engine, so);
  if (!name.empty()) session.set_adapters({{name, 1.0f, version}});
  const int64_t n_vocab = engine.config().n_vocab;
  std::vector<float> logits;  // [n_tokens, n_vocab]
  session.feed(s.tokens, &logits);
  EBB_CHECK(logits.size() >= s.tokens.size() * static_cast<size_t>(n_vocab));
  for (size_t i = 1; i < s.tokens.size(); ++i) {
    if (!(s.weights[i] > 0.0f)) continue;
    const float* row = logits.data() + (i - 1) * static_cast<size_t>(n_vocab);
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < n_vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
    double z = 0;
    for (int64_t v = 0; v < n_vocab; ++v) z += std::exp(static_cast<double>(row[v]) - max);
    out.sum += -(static_cast<double>(row[s.tokens[i]]) - max - std::log(z));
    ++out.tokens;
  }
  return out;
}

double heldout_loss(Engine& engine, const std::string& name, uint64_t version, const std::vector<TrainSample>& samples) {
  LossSum total;
  for (const TrainSample& s : samples) {
    const LossSum l = heldout_loss_sum(engine, name, version, s);
    total.sum += l.sum;
    total.tokens += l.tokens;
  }
  return total.tokens > 0 ? total.sum / static_cast<double>(total.tokens) : 0.0;
}

}  // namespace ebb
