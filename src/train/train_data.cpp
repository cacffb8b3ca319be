#include "train/train_data.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "platform/error.h"

namespace ebb {

namespace {

std::vector<int32_t> encode(const Tokenizer& tok, const std::string& text, bool bos, bool special) {
  EncodeOptions eo;
  eo.add_bos = bos;
  eo.parse_special = special;
  return tok.encode(text, eo);
}

// A conversation rendered through a (Jinja) renderer: the whole text's
// tokens, weighing 1 on each assistant span (assistant_spans) and 0 elsewhere.
// A span's tokens are counted as the tokens of the text up to its ends, as the
// marker path counts them (boundaries fall on control tokens and newlines).
void weigh_assistant_turns(const Tokenizer& tok, const ChatRenderer& r, const std::vector<ChatMessage>& msgs,
                           bool bos, const std::vector<std::string>& turn_ends, TrainSample& s) {
  const std::string full = r.render(msgs, false);
  const bool add_bos = bos && !r.writes_bos(full);
  s.tokens = encode(tok, full, add_bos, true);
  s.weights.assign(s.tokens.size(), 0.0f);
  for (const auto& [begin, end] : assistant_spans(r, msgs, full, turn_ends)) {
    const size_t from = encode(tok, full.substr(0, begin), add_bos, true).size();
    const size_t to = encode(tok, full.substr(0, end), add_bos, true).size();
    for (size_t i = from; i < to && i < s.weights.size(); ++i) s.weights[i] = 1.0f;
  }
}

// Lines of a file, each at most max_line bytes, the file at most max_file
// bytes: a longer line or file is an error naming it (nothing past the
// limit is read).
class BoundedLines {
 public:
  BoundedLines(const std::string& path, uint64_t max_line, uint64_t max_file)
      : path_(path), max_line_(max_line), max_file_(max_file), in_(path, std::ios::binary) {
    if (!in_) throw Error(path + ": cannot open the training data");
  }
  // The next line (without its newline); false at the end of the file.
  bool next(std::string& line) {
    line.clear();
    if (!in_) return false;
    ++line_no_;
    char c;
    while (in_.get(c)) {
      if (++read_ > max_file_) {
        throw Error(path_ + ":" + std::to_string(line_no_) + ": the file is larger than " + std::to_string(max_file_) +
                    " bytes, the most training data read from one file (split it)");
      }
      if (c == '\n') return true;
      if (line.size() >= max_line_) {
        throw Error(path_ + ":" + std::to_string(line_no_) + ": the line is longer than " +
                    std::to_string(max_line_) + " bytes (samples are cut to --max-tokens tokens; is this a JSONL file?)");
      }
      line += c;
    }
    return !line.empty();
  }
  int64_t line_no() const { return line_no_; }

 private:
  std::string path_;
  uint64_t max_line_, max_file_;
  std::ifstream in_;
  int64_t line_no_ = 0;
  uint64_t read_ = 0;
};

}  // namespace

std::vector<TrainSample> load_train_data(const std::string& path, const Tokenizer& tok, const TrainDataOptions& o,
                                         std::vector<std::string>* notes) {
  const uint64_t max_line =
      o.max_line_bytes > 0 ? o.max_line_bytes : std::max<uint64_t>(1u << 20, static_cast<uint64_t>(o.max_tokens) * 64);
  BoundedLines in(path, max_line, o.max_file_bytes);
  std::vector<TrainSample> out;
  std::string line;
  const bool bos = o.add_bos && tok.add_bos_default();
  bool marker_noted = false;
  std::vector<std::string> turn_ends;  // where an assistant turn's loss ends (Jinja)
  if (o.renderer) {
    turn_ends = end_of_turn_texts(tok);
    for (const std::string& e : o.renderer->stop_strings()) turn_ends.push_back(e);
  }
  while (in.next(line)) {
    const int64_t line_no = in.line_no();
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(where + ": not valid JSON (" + std::string(e.what()) + ")");
    }
    if (!j.is_object()) throw Error(where + ": each line must be a JSON object");
    TrainSample s;
    auto str = [&](const char* key) {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_string()) throw Error(where + ": \"" + key + "\" must be a string");
      return it->get<std::string>();
    };
    if (j.contains("tokens")) {
      const auto& t = j["tokens"];
      const auto w = j.find("weights");
      if (!t.is_array() || w == j.end() || !w->is_array() || w->size() != t.size()) {
        throw Error(where + ": \"tokens\" and \"weights\" must be arrays of the same length");
      }
      for (size_t i = 0; i < t.size(); ++i) {
        if (!t[i].is_number_integer() || !(*w)[i].is_number()) {
          throw Error(where + ": tokens must be integers and weights numbers (element " + std::to_string(i) + ")");
        }
        const int64_t id = t[i].get<int64_t>();
        if (id < 0 || id >= tok.n_vocab()) {
          throw Error(where + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                      std::to_string(tok.n_vocab()) + ")");
        }
        s.tokens.push_back(static_cast<int32_t>(id));
        s.weights.push_back((*w)[i].get<float>());
      }
    } else if (j.contains("messages")) {
      const auto& m = j["messages"];
      if (!m.is_array() || m.empty()) throw Error(where + ": \"messages\" must be a non-empty array");
      std::vector<ChatMessage> msgs;
      for (const auto& x : m) {
        if (!x.is_object() || !x.contains("role") || !x["role"].is_string() || !x.contains("content") ||
            !x["content"].is_string()) {
          throw Error(where + ": each message needs a string \"role\" and a string \"content\"");
        }
        msgs.push_back({x["role"].get<std::string>(), x["content"].get<std::string>()});
      }
      if (std::none_of(msgs.begin(), msgs.end(), [](const ChatMessage& m) { return m.role == "assistant"; })) {
        throw Error(where + ": the messages have no \"assistant\" turn, so there is nothing to learn (only the "
                            "assistant's tokens are trained)");
      }
      if (!o.renderer && !o.marker_note.empty() && !marker_noted && notes) {
        notes->push_back(where + ": \"messages\" are rendered with the " + std::string(chat_format_name(o.format)) +
                         " marker format: " + o.marker_note);
        marker_noted = true;
      }
      if (o.renderer) {
        weigh_assistant_turns(tok, *o.renderer, msgs, bos, turn_ends, s);
      } else {
        s.tokens = encode(tok, apply_chat_template(o.format, msgs, false), bos, true);
        s.weights.assign(s.tokens.size(), 0.0f);
        for (size_t k = 0; k < msgs.size(); ++k) {
          if (msgs[k].role != "assistant") continue;
          const std::span<const ChatMessage> before(msgs.data(), k), upto(msgs.data(), k + 1);
          const size_t from = encode(tok, apply_chat_template(o.format, before, true), bos, true).size();
          const size_t to = encode(tok, apply_chat_template(o.format, upto, false), bos, true).size();
          for (size_t i = from; i < to && i < s.weights.size(); ++i) s.weights[i] = 1.0f;
        }
      }
    } else if (j.contains("prompt")) {
      const std::vector<int32_t> p = encode(tok, str("prompt"), bos, false);
      s.tokens = encode(tok, str("prompt") + str("completion"), bos, false);
      s.weights.assign(s.tokens.size(), 1.0f);
      for (size_t i = 0; i < p.size() && i < s.weights.size(); ++i) s.weights[i] = 0.0f;
    } else if (j.contains("text")) {
      s.tokens = encode(tok, str("text"), bos, false);
      s.weights.assign(s.tokens.size(), 1.0f);
    } else {
      throw Error(where + ": a line needs \"text\", \"prompt\"/\"completion\", \"messages\" or \"tokens\"/\"weights\"");
    }
    if (j.contains("weight")) {
      if (!j["weight"].is_number()) throw Error(where + ": \"weight\" must be a number");
      const float w = j["weight"].get<float>();
      for (float& x : s.weights) x *= w;
    }
    if (static_cast<int64_t>(s.tokens.size()) > o.max_tokens) {
      if (notes) {
        notes->push_back(where + ": " + std::to_string(s.tokens.size()) + " tokens, cut to " +
                         std::to_string(o.max_tokens));
      }
      s.tokens.resize(static_cast<size_t>(o.max_tokens));
      s.weights.resize(static_cast<size_t>(o.max_tokens));
    }
    if (s.tokens.size() < 2) throw Error(where + ": a sample needs at least 2 tokens");
    out.push_back(std::move(s));
  }
  if (out.empty()) throw Error(path + ": no training samples");
  return out;
}

}  // namespace ebb
