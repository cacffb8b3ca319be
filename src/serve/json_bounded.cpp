#include "serve/json_bounded.h"

#include <vector>

namespace ebb::serve {

namespace {

using nlohmann::json;

// Builds the DOM as nlohmann's own SAX DOM parser does: `open` holds the
// arrays and objects being filled, each the last value added to the one
// before it, so the pointers stay valid while they are open.
class BoundedSax final : public nlohmann::json_sax<json> {
 public:
  BoundedSax(const JsonLimits& lim, json& root, JsonError& err) : lim_(lim), root_(root), err_(err) {}

  bool null() override { return put(json(nullptr)) != nullptr; }
  bool boolean(bool v) override { return put(json(v)) != nullptr; }
  bool number_integer(number_integer_t v) override { return put(json(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return put(json(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t&) override { return put(json(v)) != nullptr; }
  bool string(string_t& v) override { return put(json(std::move(v))) != nullptr; }
  bool binary(binary_t& v) override { return put(json::binary(std::move(v))) != nullptr; }
  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t pos, const std::string& token, const nlohmann::detail::exception& ex) override {
    if (!err_.message.empty()) return false;  // a limit already stopped the parse
    if (ex.id == 406) {  // a number out of range
      err_.field = path();
      err_.message = "the number " + token + " is out of range (it does not fit a double)";
    } else {
      std::string what = ex.what();
      // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> what follows the prefix
      const size_t p = what.find("] ");
      if (p != std::string::npos) what = what.substr(p + 2);
      err_.message = what;
      (void)pos;
    }
    return false;
  }

 private:
  json* put(json v) {
    if (++values_ > lim_.max_values) {
      fail("more than " + std::to_string(lim_.max_values) + " values");
      return nullptr;
    }
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }
  bool open(json v) {
    if (open_.size() >= lim_.max_depth) {
      fail("nested deeper than " + std::to_string(lim_.max_depth) + " levels");
      return false;
    }
    const std::string k = key_;
    json* p = put(std::move(v));
    if (!p) return false;
    open_.push_back(p);
    keys_.push_back(k);
    return true;
  }
  bool close() {
    open_.pop_back();
    keys_.pop_back();
    return true;
  }
  void fail(std::string why) { err_.message = std::move(why); }
  // Where the value being read goes: "a.b[2].c".
  std::string path() const {
    std::string s;
    for (size_t i = 0; i < open_.size(); ++i) {
      const json& c = *open_[i];
      if (i > 0) {
        const json& parent = *open_[i - 1];
        if (parent.is_array()) s += "[" + std::to_string(parent.size() - 1) + "]";
        else s += (s.empty() ? "" : ".") + keys_[i];
      }
      (void)c;
    }
    if (!open_.empty()) {
      const json& last = *open_.back();
      if (last.is_array()) s += "[" + std::to_string(last.size()) + "]";
      else s += (s.empty() ? "" : ".") + key_;
    }
    return s;
  }

  const JsonLimits& lim_;
  json& root_;
  JsonError& err_;
  std::vector<json*> open_;
  std::vector<std::string> keys_;  // the key each open container was stored under
  std::string key_;
  size_t values_ = 0;
};

}  // namespace

bool parse_json_bounded(std::string_view text, const JsonLimits& lim, nlohmann::json& out, JsonError& err) {
  out = nullptr;
  err = JsonError{};
  BoundedSax sax(lim, out, err);
  const bool ok = json::sax_parse(text.begin(), text.end(), &sax, nlohmann::detail::input_format_t::json, true);
  if (ok && err.message.empty()) return true;
  if (err.message.empty()) err.message = "not valid JSON";
  out = nullptr;  // give back what was built
  return false;
}

}  // namespace ebb::serve
