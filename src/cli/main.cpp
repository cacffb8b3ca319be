// ebb command line: run, chat, inspect, synth, bench, profile.
//
// Exit status: 0 success; 1 an error (bad input, a failed turn, out of
// memory), with "ebb: error: ..." on stderr; 2 a usage error (unknown
// subcommand or option, bad option value), with the reason and a hint.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "cli/options.h"
#include "ebb_version.h"
#include "kernels/cpu.h"
#include "platform/error.h"

namespace {

constexpr int kUsageError = 2;

// llama.cpp spells a few options as one dash and several letters, which
// CLI11 reads as bundled short flags; they become their long names here.
// -fa/--flash-attn take an optional on|off|auto, as in llama.cpp. `ebb help
// [SUBCOMMAND...]` is `ebb [SUBCOMMAND...] --help`.
std::vector<std::string> llama_spellings(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-ngl") a = "--n-gpu-layers";
    else if (a == "-sys") a = "--system-prompt";
    else if (a.rfind("-ngl=", 0) == 0) a = "--n-gpu-layers=" + a.substr(5);
    else if (a == "-fa" || a == "--flash-attn") {
      const std::string next = i + 1 < argc ? argv[i + 1] : "";
      if (next == "on" || next == "off" || next == "auto") {
        a = "--flash-attn=" + next;
        ++i;
      } else {
        a = "--flash-attn=on";
      }
    }
    out.push_back(std::move(a));
  }
  if (out.size() >= 2 && out[1] == "help") {
    out.erase(out.begin() + 1);
    out.push_back("--help");
  }
  return out;
}

// The short flags mean one thing in every subcommand that has them.
constexpr const char* kShortFlags =
    "Short options mean the same in every subcommand, as in llama.cpp's tools:\n"
    "  -m model   -t threads   -c context size   -b prefill batch   -v verbose\n"
    "  -p prompt (bench: prompt tokens)   -n tokens to generate   -f prompt file\n"
    "  -e process escapes in the prompt   -r reverse prompt (a stop string)\n"
    "  -o output file   -q quiet   -h help\n"
    "  -ngl, -fa, -sys are llama.cpp's spellings of --n-gpu-layers, --flash-attn, --system-prompt.\n"
    "Long options only where a letter would mean two things (train --rank, train --batch-size, bench --reps).\n"
    "ebb help SUBCOMMAND (or ebb SUBCOMMAND --help) shows a subcommand's options.";

std::string names(const CLI::App* app) {
  std::string s;
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
    if (!s.empty()) s += ", ";
    s += sub->get_name();
  }
  return s;
}

// Names an unknown subcommand (CLI11 would only say one is required).
// Returns false after printing the error.
bool check_subcommands(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* level = &app;
  std::string path = "ebb";
  for (size_t i = 1; i < args.size(); ++i) {
    if (level->get_subcommands([](const CLI::App*) { return true; }).empty()) return true;
    const std::string& a = args[i];
    if (a.empty() || a[0] == '-') return true;  // options (or --help) come first: CLI11 decides
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : level->get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() == a) next = sub;
    if (!next) {
      std::vector<std::string> subs;
      for (const CLI::App* sub : level->get_subcommands([](const CLI::App*) { return true; }))
        subs.push_back(sub->get_name());
      const std::string close = ebb::cli::closest_name(a, subs);
      std::fprintf(stderr, "ebb: error: '%s' is not a subcommand of %s%s; the subcommands are: %s (see %s --help)\n",
                   a.c_str(), path.c_str(), close.empty() ? "" : (" (did you mean " + close + "?)").c_str(),
                   names(level).c_str(), path.c_str());
      return false;
    }
    level = next;
    path += " " + a;
  }
  return true;
}

const CLI::App* find_subcommand(const CLI::App& app, const std::vector<std::string>& args, std::string* path) {
  const CLI::App* level = &app;
  *path = "ebb";
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.empty() || a[0] == '-') break;
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : level->get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() == a) next = sub;
    if (!next) break;
    level = next;
    *path += " " + a;
  }
  return level;
}

// The option names of a subcommand; hidden ones (for tests) only in `all`.
void option_names(const CLI::App* app, std::vector<std::string>* shown, std::vector<std::string>* all) {
  for (const CLI::Option* o : app->get_options([](const CLI::Option*) { return true; })) {
    for (const std::string& n : o->get_lnames()) {
      all->push_back("--" + n);
      if (!o->get_group().empty()) shown->push_back("--" + n);
    }
    for (const std::string& n : o->get_snames()) {
      all->push_back("-" + n);
      if (!o->get_group().empty()) shown->push_back("-" + n);
    }
  }
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end && *end == '\0';
}

// An unknown option named, with the closest known one ("did you mean
// --temp?"); false when no argument is an unknown option (CLI11's message
// stands then).
bool explain_unknown_options(const CLI::App& app, const std::vector<std::string>& args) {
  std::string path;
  const CLI::App* sub = find_subcommand(app, args, &path);
  std::vector<std::string> known, all;
  for (const CLI::App* a = sub; a; a = a->get_parent()) option_names(a, &known, &all);
  bool any = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-' || is_number(a)) continue;
    std::string name = a.substr(0, a.find('='));
    if (name[1] != '-' && name.size() > 2) name = name.substr(0, 2);  // -n5, or bundled flags: the first
    if (std::find(all.begin(), all.end(), name) != all.end()) continue;
    const std::string close = ebb::cli::closest_name(name, known);
    std::fprintf(stderr, "ebb: error: %s has no option %s%s (see %s --help)\n", path.c_str(), name.c_str(),
                 close.empty() ? "" : ("; did you mean " + close + "?").c_str(), path.c_str());
    any = true;
  }
  return any;
}

// CLI11 shows a negated flag ("!--no-tensors" on a bool that defaults to
// true) as "--no-tensors{false}"; help shows the name a user types.
class Formatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    std::string s = CLI::Formatter::make_option_name(opt, is_positional);
    for (const char* art : {"{false}", "{true}"}) {
      for (size_t at; (at = s.find(art)) != std::string::npos;) s.erase(at, std::string(art).size());
    }
    return s;
  }

  // The common options first (the default group, then each subcommand's
  // own groups), the engine, memory and cache options last; otherwise as
  // CLI11's own help.
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::string out = make_description(app) + make_usage(app, name) + make_positionals(app);
    std::vector<std::string> groups = app->get_groups();
    std::stable_partition(groups.begin(), groups.end(), [](const std::string& g) { return g != ebb::cli::kEngineGroup; });
    for (const std::string& group : groups) {
      if (group.empty()) continue;
      std::vector<const CLI::Option*> opts = app->get_options([&](const CLI::Option* o) {
        return o->get_group() == group && o->nonpositional();
      });
      if (opts.empty()) continue;
      out += make_group(group, false, opts);
    }
    return out + make_subcommands(app, mode) + "\n" + make_footer(app);
  }
};

void print_version() {
  std::string compiled;
  for (ebb::Isa isa : {ebb::Isa::kScalar, ebb::Isa::kAvx2, ebb::Isa::kAvx512, ebb::Isa::kNeon}) {
    if (!ebb::isa_compiled(isa)) continue;
    if (!compiled.empty()) compiled += ", ";
    compiled += std::string(ebb::isa_name(isa));
  }
  std::printf("ebb %s (commit %s)\nkernels: %s on this CPU (compiled: %s)\n", EBB_VERSION, EBB_GIT_COMMIT,
              std::string(ebb::isa_name(ebb::best_isa())).c_str(), compiled.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ebb: an LLM runtime for devices whose memory is shared and scarce"};
  app.footer(kShortFlags);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  app.formatter(std::make_shared<Formatter>());
  bool version = false;
  app.add_flag("--version", version, "Print the version, the git commit and the kernel target, and exit");
  int rc = 0;
  std::vector<std::string> args = llama_spellings(argc, argv);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  try {
    ebb::cli::add_run_command(app, &rc);
    ebb::cli::add_chat_command(app, &rc);
    ebb::cli::add_inspect_command(app, &rc);
    ebb::cli::add_synth_command(app, &rc);
    ebb::cli::add_bench_command(app, &rc);
    ebb::cli::add_profile_command(app, &rc);
    ebb::cli::add_adapter_command(app, &rc);
    ebb::cli::add_train_command(app, &rc);
    ebb::cli::add_serve_command(app, &rc);
    if (!check_subcommands(app, args)) return kUsageError;
    app.parse(static_cast<int>(cargs.size()), cargs.data());
    if (version) {
      print_version();
      return 0;
    }
    // A group (ebb, ebb bench) given without one of its subcommands.
    const CLI::App* level = &app;
    std::string path = "ebb";
    for (;;) {
      const bool group = !level->get_subcommands([](const CLI::App*) { return true; }).empty();
      if (!group) break;
      if (level->get_subcommands().empty()) {
        std::fprintf(stderr, "ebb: error: %s needs a subcommand: %s (see %s --help)\n", path.c_str(),
                     names(level).c_str(), path.c_str());
        return kUsageError;
      }
      level = level->get_subcommands().front();
      path += " " + level->get_name();
    }
  } catch (const CLI::ExtrasError& e) {
    if (explain_unknown_options(app, args)) return kUsageError;
    app.exit(e);
    return kUsageError;
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the message and a hint
    return code == 0 ? 0 : kUsageError;
  } catch (const ebb::cli::UsageError& e) {
    std::fprintf(stderr, "ebb: error: %s\n", e.what());
    return kUsageError;
  } catch (const ebb::Error& e) {
    std::fprintf(stderr, "ebb: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ebb: error: out of memory (lower --ctx, or set --memory-budget)\n");
    return 1;
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "ebb: error: the system refused a resource (out of memory or threads?): %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ebb: unexpected error: %s\n", e.what());
    return 1;
  }
  return rc;
}
