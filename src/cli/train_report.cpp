#include "cli/train_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "platform/error.h"
#include "runtime/session.h"

namespace ebb::cli {

double heldout_loss(Engine& engine, std::unique_ptr<LoraAdapter> adapter, const std::vector<TrainSample>& samples) {
  const std::string name = "ebb-train-heldout";
  engine.adapters().add(name, std::move(adapter), true);
  struct Unload {
    Engine& e;
    const std::string& n;
    ~Unload() {
      try {
        e.adapters().unload(n);
      } catch (const Error&) {
      }
    }
  } unload{engine, name};
  size_t longest = 0;
  for (const TrainSample& s : samples) longest = std::max(longest, s.tokens.size());
  SessionOptions so;
  so.n_ctx = static_cast<int64_t>(longest) + 1;
  double sum = 0, weight = 0;
  const int64_t n_vocab = engine.config().n_vocab;
  std::vector<float> logits;  // [n_tokens, n_vocab]
  {
    Session session(engine, so);
    session.set_adapters({{name, 1.0f}});
    for (const TrainSample& s : samples) {
      session.clear();
      logits.clear();
      session.feed(s.tokens, &logits);
      for (size_t i = 1; i < s.tokens.size(); ++i) {
        if (s.weights[i] == 0.0f) continue;
        const float* row = logits.data() + (i - 1) * static_cast<size_t>(n_vocab);
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t v = 0; v < n_vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
        double z = 0;
        for (int64_t v = 0; v < n_vocab; ++v) z += std::exp(static_cast<double>(row[v]) - max);
        const double logp = static_cast<double>(row[s.tokens[i]]) - max - std::log(z);
        sum += -logp * s.weights[i];
        weight += s.weights[i];
      }
    }
  }
  return weight != 0 ? sum / weight : 0.0;
}

namespace {

std::string xml_escaped(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

std::string loss_chart_svg(const std::vector<LossPoint>& train, const std::vector<LossPoint>& eval,
                           const std::string& title, int width, int height) {
  const double left = 64, right = 16, top = 36, bottom = 44;
  const double pw = width - left - right, ph = height - top - bottom;
  int64_t s0 = std::numeric_limits<int64_t>::max(), s1 = std::numeric_limits<int64_t>::min();
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto* v : {&train, &eval}) {
    for (const LossPoint& p : *v) {
      if (!std::isfinite(p.loss)) continue;
      s0 = std::min(s0, p.step);
      s1 = std::max(s1, p.step);
      lo = std::min(lo, p.loss);
      hi = std::max(hi, p.loss);
    }
  }
  if (s0 > s1) s0 = s1 = 0;
  if (!(lo <= hi)) lo = hi = 0;
  if (s1 == s0) s1 = s0 + 1;
  if (hi - lo < 1e-9) {
    hi += 0.5;
    lo -= 0.5;
  }
  auto x = [&](int64_t step) { return left + pw * static_cast<double>(step - s0) / static_cast<double>(s1 - s0); };
  auto y = [&](double loss) { return top + ph * (hi - loss) / (hi - lo); };
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
                    std::to_string(height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + num(left) + "\" y=\"20\" font-size=\"14\">" + xml_escaped(title) + "</text>\n";
  // Axes, with the ranges at their ends.
  svg += "<path d=\"M" + num(left) + " " + num(top) + " V" + num(top + ph) + " H" + num(left + pw) +
         "\" stroke=\"black\" fill=\"none\"/>\n";
  svg += "<text x=\"" + num(left - 6) + "\" y=\"" + num(top + 4) + "\" text-anchor=\"end\">" + num(hi) + "</text>\n";
  svg += "<text x=\"" + num(left - 6) + "\" y=\"" + num(top + ph) + "\" text-anchor=\"end\">" + num(lo) + "</text>\n";
  svg += "<text x=\"" + num(left) + "\" y=\"" + num(top + ph + 16) + "\" text-anchor=\"middle\">" +
         std::to_string(s0) + "</text>\n";
  svg += "<text x=\"" + num(left + pw) + "\" y=\"" + num(top + ph + 16) + "\" text-anchor=\"middle\">" +
         std::to_string(s1) + "</text>\n";
  svg += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(height - 8.0) + "\" text-anchor=\"middle\">step</text>\n";
  svg += "<text x=\"14\" y=\"" + num(top + ph / 2) + "\" transform=\"rotate(-90 14 " + num(top + ph / 2) +
         ")\" text-anchor=\"middle\">loss</text>\n";
  auto line = [&](const std::vector<LossPoint>& v, const char* color, const char* label, double ly) {
    if (v.empty()) return;
    std::string d;
    for (const LossPoint& p : v) {
      if (!std::isfinite(p.loss)) continue;
      d += (d.empty() ? "M" : " L") + num(x(p.step)) + " " + num(y(p.loss));
    }
    svg += "<path class=\"" + std::string(label) + "\" d=\"" + d + "\" stroke=\"" + color +
           "\" stroke-width=\"1.5\" fill=\"none\"/>\n";
    svg += "<line x1=\"" + num(left + pw - 110) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(left + pw - 90) + "\" y2=\"" +
           num(ly) + "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    svg += "<text x=\"" + num(left + pw - 84) + "\" y=\"" + num(ly + 4) + "\">" + label + " loss</text>\n";
  };
  line(train, "#1f77b4", "train", top + 10);
  line(eval, "#d62728", "eval", top + 28);
  svg += "</svg>\n";
  return svg;
}

}  // namespace ebb::cli
