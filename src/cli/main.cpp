// ebb command line: run, chat, inspect, synth, bench, profile.
//
// Exit status: 0 success; 1 an error (bad input, a failed turn, out of
// memory), with "ebb: error: ..." on stderr; 2 a usage error (unknown
// subcommand or option, bad option value), with the reason and a hint.
#include <cstdio>
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
std::vector<std::string> llama_spellings(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-ngl") a = "--n-gpu-layers";
    else if (a == "-sys") a = "--system-prompt";
    else if (a.rfind("-ngl=", 0) == 0) a = "--n-gpu-layers=" + a.substr(5);
    out.push_back(std::move(a));
  }
  return out;
}

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
      std::fprintf(stderr, "ebb: error: '%s' is not a subcommand of %s; the subcommands are: %s (see %s --help)\n",
                   a.c_str(), path.c_str(), names(level).c_str(), path.c_str());
      return false;
    }
    level = next;
    path += " " + a;
  }
  return true;
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
