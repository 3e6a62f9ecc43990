// kvsnap: keep llama.cpp inference sessions across restarts and cache types.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <algorithm>
#include <exception>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "cli/llama_spellings.h"
#include "cli/progress.h"

namespace {

// Edits (insert, delete, replace) from a to b: for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A word where a command that needs a subcommand expects one, naming none of its subcommands
// (CLI11 says only "A subcommand is required"): "unknown command 'infoo' (did you mean 'info'?)".
// Empty when the words name commands. `takes_value` (called on every word, as it follows the
// commands the words select) says which options take a value, so that it is skipped.
std::string unknown_command(const CLI::App& app, const std::vector<std::string>& words,
                            const std::function<bool(const std::string&)>& takes_value) {
  const CLI::App* c = &app;
  for (size_t i = 1; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w == "--") return "";
    const bool option = !w.empty() && w[0] == '-';
    const bool skip_value = takes_value(w) && w.find('=') == std::string::npos;  // also follows the commands
    if (option) {
      const std::string name = w.substr(0, w.find('='));
      bool known = false;
      for (const CLI::App* a = c; a != nullptr && !known; a = a->get_parent()) known = a->get_option_no_throw(name);
      if (!known) return "";  // CLI11 names it
      if (skip_value) ++i;
      continue;
    }
    const auto subs = c->get_subcommands([&](const CLI::App* s) { return s->check_name(w); });
    if (!subs.empty()) {
      c = subs.front();
      continue;
    }
    if (c->get_require_subcommand_min() == 0) return "";
    std::string best;
    size_t best_d = 3;  // at most two edits away
    for (const CLI::App* s : c->get_subcommands([](const CLI::App*) { return true; })) {
      const size_t d = edit_distance(w, s->get_name());
      if (d < best_d) best_d = d, best = s->get_name();
    }
    const std::string parent = c == &app ? "kvsnap" : "kvsnap " + c->get_name();
    return "unknown command '" + w + "'" + (best.empty() ? "" : " (did you mean '" + best + "'?)") + "; '" + parent +
           " --help' lists the commands";
  }
  return "";
}

int run(int argc, char** argv) {
  CLI::App app{"kvsnap: read, convert and store llama.cpp KV caches (slot and session files)"};
  app.set_version_flag("--version", std::string("kvsnap ") + KVSNAP_VERSION);
  app.require_subcommand(1);
  // Also shown by the commands that have no footer of their own: it must read right there too.
  app.footer("\nA command's options: kvsnap COMMAND --help. What each exit status means: kvsnap man [COMMAND] | man -l - "
             "(EXIT STATUS).");
  kvsnap::cli::install_interrupt_handler();
  int exit_status = kvsnap::cli::kExitOk;
  const std::vector<std::string> words(argv, argv + argc);
  kvsnap::cli::setup_commands_for(app, exit_status, words);
  // llama-server's -ctk/-ctv/-fa, as users paste them (cli/llama_spellings.h); CLI11 says which
  // words are options that take a value, in the subcommand the words so far selected
  const CLI::App* cmd = &app;
  const auto takes_value = [&cmd](const std::string& word) {
    if (word.empty() || word[0] != '-') {
      const auto subs = cmd->get_subcommands([&](const CLI::App* s) { return s->check_name(word); });
      if (!subs.empty()) cmd = subs.front();
      return false;
    }
    for (const CLI::App* c = cmd; c != nullptr; c = c->get_parent()) {
      if (const CLI::Option* o = c->get_option_no_throw(word)) return o->get_items_expected_min() > 0;
    }
    return false;
  };
  std::vector<std::string> args =
      kvsnap::cli::with_kvsnap_spellings(words, takes_value);
  {
    cmd = &app;  // takes_value follows the words again from the top
    const std::string unknown = unknown_command(app, args, takes_value);
    if (!unknown.empty()) {
      std::fprintf(stderr, "kvsnap: %s\n", unknown.c_str());
      return kvsnap::cli::kExitUsage;
    }
  }
  std::vector<char*> args_c;
  for (std::string& a : args) args_c.push_back(a.data());
  try {
    app.parse(static_cast<int>(args_c.size()), args_c.data());
  } catch (const CLI::ParseError& e) {
    // Every usage error is exit 2 (docs/cli.md), said as kvsnap's own errors are: the command first.
    if (e.get_exit_code() != static_cast<int>(CLI::ExitCodes::Success)) {
      std::string where = "kvsnap";
      for (const CLI::App* c = &app; !c->get_subcommands().empty();) {
        c = c->get_subcommands().front();
        where += " " + c->get_name();
      }
      std::fprintf(stderr, "%s: usage: %s ('%s --help' lists the options)\n", where.c_str(), e.what(), where.c_str());
      return kvsnap::cli::kExitUsage;
    }
    // --help and --version end here (exit 0)
    const int code = app.exit(e);
    // The help or version text went to standard output: a full disk or a closed pipe is not a success
    std::cout.flush();
    if (code == 0 && !std::cout) {
      std::fprintf(stderr, "kvsnap: writing the help to stdout failed (a full disk, a closed pipe?)\n");
      return kvsnap::cli::exit_code(kvsnap::Code::kIOError);
    }
    return code == 0 ? kvsnap::cli::kExitOk : kvsnap::cli::kExitUsage;
  }
  return exit_status;
}

// The edge of the process: errors are values inside kvsnap, so an exception
// here is a bug; it still ends with a message and an exit code, not abort().
int internal_error(const char* what) {
  std::fprintf(stderr, "kvsnap: internal error: %s\n", what);
  return kvsnap::cli::kExitInternal;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int code = run(argc, argv);
    // Stopped by a signal, with what it was writing removed: the process ends by that signal, so
    // that a shell running it in a loop stops too (cli/progress.h). Exit 130 only if none was taken.
    if (code == kvsnap::cli::kExitInterrupted) kvsnap::cli::end_by_interrupting_signal();
    return code;
  } catch (const std::bad_alloc&) {
    // Not a bug (base/status.h): the machine ran out of memory. The C API reports it as I/O too.
    std::fprintf(stderr, "kvsnap: out of memory\n");
    return kvsnap::cli::exit_code(kvsnap::Code::kIOError);
  } catch (const std::exception& e) {
    return internal_error(e.what());
  } catch (...) {
    return internal_error("unknown exception");
  }
}
