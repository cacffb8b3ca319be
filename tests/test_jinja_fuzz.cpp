// A bounded mutation test of the Jinja engine: every golden chat template,
// mutated a few thousand times with a fixed seed (bytes flipped, spans
// deleted or duplicated, hostile snippets inserted: loops inside loops,
// huge repetitions, self-recursive macros, deep nesting), is parsed and
// rendered. Each must render or throw ebb::Error: never crash, hang, or
// run past the limits. A crash here is a bug in the engine; the libFuzzer
// target (tests/fuzz/fuzz_jinja.cpp, scripts/fuzz_jinja.sh) searches further.
#include <gtest/gtest.h>

#include <chrono>
#include <dirent.h>
#include <fstream>
#include <random>
#include <sstream>

#include "model/chat_jinja.h"
#include "support.h"

namespace ebb {
namespace {

using ojson = nlohmann::ordered_json;

struct Seed {
  std::string name, source;
  ojson messages, tools;
};

std::vector<Seed> load_seeds() {
  std::string dir = test::shared_path("golden/templates");
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return {};
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 6 && n.compare(n.size() - 6, 6, ".jinja") == 0) names.push_back(n.substr(0, n.size() - 6));
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::vector<Seed> seeds;
  for (const auto& n : names) {
    Seed s;
    s.name = n;
    std::ifstream f(dir + "/" + n + ".jinja", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    s.source = ss.str();
    // The richest case: a tool call and its result, with tools.
    std::ifstream jl(dir + "/" + n + ".jsonl");
    std::string line;
    while (std::getline(jl, line)) {
      ojson c = ojson::parse(line);
      if (s.messages.is_null() || c["case"] == "tool_call_and_result") {
        s.messages = c["messages"];
        s.tools = c["tools"];
      }
    }
    seeds.push_back(std::move(s));
  }
  return seeds;
}

const char* const kSnippets[] = {
    "{% for x in range(100000) %}",
    "{% endfor %}",
    "{{ 'x' * 10**9 }}",
    "{{ [1] * 10**9 }}",
    "{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}",
    "{% macro q() %}{{ caller() }}{% endmacro %}{% call q() %}{{ q() }}{% endcall %}",
    "{% for a in messages %}{% for b in messages %}{% for c in range(99999) %}{{ a }}{% endfor %}{% endfor %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
    "{% set ns = namespace(l=[]) %}{% for i in range(9999) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l | tojson }}",
    "{{ ((((((((((((((((((((1)))))))))))))))))))) }}",
    "{% if true %}",
    "{% endif %}",
    "{{ messages[0].content.split('') }}",
    "{{ range(99999) | join(',') * 99 }}",
    "{{ '%s' % messages }}{{ '{}'.format(tools) }}",
    "{{ messages | tojson(indent=100000) }}",
    "{{ x.y.z }}",
    "{% raw %}",
    "{#",
    "{{",
    "{%-",
    "-%}",
    "}}",
    "'",
    "\"",
    "(",
    "[",
};

// Positions just after a tag: edits there keep the template parseable more
// often, so that more mutants reach the renderer.
std::vector<size_t> tag_ends(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if ((s[i] == '}' || s[i] == '%' || s[i] == '#') && s[i + 1] == '}') at.push_back(i + 2);
  return at;
}

std::string mutate(const std::string& src, std::mt19937& rng) {
  std::string s = src;
  auto pick = [&](size_t n) { return n == 0 ? size_t(0) : size_t(rng() % n); };
  auto place = [&]() {
    std::vector<size_t> ends = tag_ends(s);
    if (!ends.empty() && rng() % 4 != 0) return ends[pick(ends.size())];
    return pick(s.size() + 1);
  };
  int n = 1 + int(rng() % 3 == 0) + int(rng() % 5 == 0);
  static const char kBytes[] = "{}%#-+()[]'\"|.~*/=<>!,: \n\tabxyz019_";
  for (int k = 0; k < n; ++k) {
    switch (rng() % 7) {
      case 0:  // flip a byte
        if (!s.empty()) s[pick(s.size())] = kBytes[pick(sizeof kBytes - 1)];
        break;
      case 1: {  // delete a span
        size_t at = pick(s.size()), len = 1 + pick(64);
        s.erase(at, len);
        break;
      }
      case 2: {  // duplicate a span between two tag ends (statements inside themselves)
        std::vector<size_t> ends = tag_ends(s);
        if (ends.size() < 2) break;
        size_t a = ends[pick(ends.size())], b = ends[pick(ends.size())];
        if (a > b) std::swap(a, b);
        std::string span = s.substr(a, std::min<size_t>(b - a, 4000));
        s.insert(place(), span);
        break;
      }
      case 3:
      case 4:  // a hostile snippet
        s.insert(place(), kSnippets[pick(sizeof kSnippets / sizeof kSnippets[0])]);
        break;
      case 5: {  // wrap a span in a loop
        size_t a = place(), b = place();
        if (a > b) std::swap(a, b);
        s.insert(b, "{% endfor %}");
        s.insert(a, "{% for z in range(300) %}");
        break;
      }
      default: {  // repeat one character many times (deep nesting)
        char c = "([{-"[pick(4)];
        s.insert(pick(s.size() + 1), std::string(100 + pick(2000), c));
        break;
      }
    }
  }
  return s;
}

TEST(JinjaFuzz, MutatedGoldenTemplatesRenderOrFailCleanly) {
  std::vector<Seed> seeds = load_seeds();
  ASSERT_GE(seeds.size(), 30u);
  ChatTemplateOptions opts;
  opts.clock = [] { return std::time_t(1721989800); };
  // Tighter than the defaults, so that the thousands of renders stay quick;
  // the limits themselves are what is exercised.
  opts.limits.max_loop_iterations = 100000;
  opts.limits.max_work = 5'000'000;
  opts.limits.max_output_bytes = size_t(1) << 20;
  opts.limits.max_string_bytes = size_t(1) << 20;
  const int kPerTemplate = 200;
  std::mt19937 rng(20240726);
  int rendered = 0, parse_errors = 0, render_errors = 0;
  double worst_ms = 0;
  std::string worst;
  auto t_all = std::chrono::steady_clock::now();
  for (const Seed& seed : seeds) {
    for (int i = 0; i < kPerTemplate; ++i) {
      std::string src = mutate(seed.source, rng);
      auto t0 = std::chrono::steady_clock::now();
      try {
        ChatTemplate t(src, "<s>", "</s>", opts);
        try {
          t.render(seed.messages, seed.tools, i % 2 == 0);
          ++rendered;
        } catch (const ebb::Error&) {
          ++render_errors;
        }
      } catch (const ebb::Error&) {
        ++parse_errors;
      } catch (const std::exception& e) {
        ADD_FAILURE() << seed.name << " mutant " << i << ": not an ebb::Error: " << e.what() << "\n" << src;
      }
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (ms > worst_ms) {
        worst_ms = ms;
        worst = seed.name + " mutant " + std::to_string(i);
      }
    }
  }
  double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_all).count();
  std::printf("%d mutants: %d rendered, %d syntax errors, %d render errors; %.1f s, slowest %.0f ms (%s)\n",
              int(seeds.size()) * kPerTemplate, rendered, parse_errors, render_errors, total_s, worst_ms,
              worst.c_str());
  // Some mutants must get through (the test would prove little otherwise).
  EXPECT_GT(rendered, 100);
  EXPECT_GT(render_errors, 100);
  EXPECT_LT(worst_ms, 5000.0) << worst;
}

// Hostile templates written on purpose, with the default limits: each is
// refused with an ebb::Error, quickly.
TEST(JinjaFuzz, HostileTemplatesAreRefused) {
  const char* hostile[] = {
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
      "{{ 'x' * 10**9 }}",
      "{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}",
      "{% macro r() %}{% call r() %}{% endcall %}{% endmacro %}{{ r() }}",
      "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}",
      "{{ range(100000) | list | string * 100 }}",
  };
  for (const char* h : hostile) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(
        {
          ChatTemplate t(h, "", "");
          t.render(ojson::array(), ojson(), false);
        },
        ebb::Error)
        << h;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 10.0) << h;
  }
}

}  // namespace
}  // namespace ebb
