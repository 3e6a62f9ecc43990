#include "cli/commands.h"

#include <CLI/CLI.hpp>

#include "cli/llama_spellings.h"

namespace kvsnap::cli {

namespace {

// Says in --help (and so in the manual pages) which of llama-server's spellings an option also
// takes (cli/llama_spellings.h renames them before parsing), from the same table.
void note_llama_spellings(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    std::vector<std::string> also;
    for (const std::string& name : o->get_lnames())
      for (std::string& s : llama_spellings_of("--" + name)) also.push_back(std::move(s));
    if (also.empty()) continue;
    std::string text = o->get_description() + "; as llama-server spells it: ";
    for (size_t i = 0; i < also.size(); ++i) text += (i ? ", " : "") + also[i];
    o->description(text);
  }
  for (CLI::App* sub : app.get_subcommands({})) note_llama_spellings(*sub);
}

}  // namespace

void setup_all_commands(CLI::App& app, int& exit_status) {
  setup_info(app, exit_status);
  setup_digest(app, exit_status);
  setup_convert(app, exit_status);
  setup_server_commands(app, exit_status);
  setup_save(app, exit_status);
  setup_restore(app, exit_status);
  setup_list_commands(app, exit_status);
  setup_maintain_commands(app, exit_status);
  setup_transfer_commands(app, exit_status);
  setup_migrate(app, exit_status);
  setup_serve(app, exit_status);
  setup_doctor(app, exit_status);
  setup_man(app, exit_status);
  setup_completion(app, exit_status);
  note_llama_spellings(app);
}

}  // namespace kvsnap::cli
