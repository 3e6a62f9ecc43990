#include "cli/commands.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iterator>
#include <string_view>

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

// Each top-level command word and the setup function that defines it (some define several),
// in the order `kvsnap --help` lists them. man and completion walk the whole tree.
struct CommandGroup {
  std::string_view words[7];  // the unused ones empty
  void (*setup)(CLI::App&, int&);
  bool needs_whole_tree;
};
constexpr CommandGroup kCommandGroups[] = {
    {{"info"}, setup_info, false},
    {{"digest"}, setup_digest, false},
    {{"convert"}, setup_convert, false},
    {{"server"}, setup_server_commands, false},
    {{"save"}, setup_save, false},
    {{"restore"}, setup_restore, false},
    {{"ls", "show", "find"}, setup_list_commands, false},
    {{"rm", "gc", "pin", "unpin", "expire", "rekey", "verify"}, setup_maintain_commands, false},
    {{"export", "import"}, setup_transfer_commands, false},
    {{"migrate"}, setup_migrate, false},
    {{"serve"}, setup_serve, false},
    {{"doctor"}, setup_doctor, false},
    {{"man"}, setup_man, true},
    {{"completion"}, setup_completion, true},
};

}  // namespace

void setup_all_commands(CLI::App& app, int& exit_status) {
  for (const CommandGroup& g : kCommandGroups) g.setup(app, exit_status);
  note_llama_spellings(app);
}

void setup_commands_for(CLI::App& app, int& exit_status, const std::vector<std::string>& args) {
  // The command is the first word; a top-level option before it (--help, --version) is about
  // the whole program.
  if (args.size() >= 2 && !args[1].empty()) {
    for (const CommandGroup& g : kCommandGroups) {
      if (g.needs_whole_tree || std::find(std::begin(g.words), std::end(g.words), args[1]) == std::end(g.words)) {
        continue;
      }
      g.setup(app, exit_status);
      note_llama_spellings(app);
      return;
    }
  }
  setup_all_commands(app, exit_status);
}

}  // namespace kvsnap::cli
