// ebb command line: run, chat, inspect.
#include <cstdio>
#include <exception>

#include "cli/options.h"
#include "platform/error.h"

int main(int argc, char** argv) {
  CLI::App app{"ebb: an LLM runtime for devices whose memory is shared and scarce"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  int rc = 0;
  try {
    ebb::cli::add_run_command(app, &rc);
    ebb::cli::add_chat_command(app, &rc);
    ebb::cli::add_inspect_command(app, &rc);
    ebb::cli::add_synth_command(app, &rc);
    ebb::cli::add_bench_command(app, &rc);
    ebb::cli::add_profile_command(app, &rc);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ebb::Error& e) {
    std::fprintf(stderr, "ebb: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ebb: unexpected error: %s\n", e.what());
    return 2;
  }
  return rc;
}
