// kvsnap man: manual pages (roff) generated from the same CLI11 definitions as
// --help: kvsnap(1) with the command list and exit codes, and one page per
// command (kvsnap-convert(1), kvsnap-server-add(1), ...) with its synopsis,
// description, options and the examples of its --help footer.
#include <CLI/CLI.hpp>

#include "base/io.h"
#include "cli/command_tree.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"
#include "cli/progress.h"

namespace kvsnap::cli {
namespace {

// Text safe for roff: backslashes escaped, no line starting with a control character.
std::string roff(const std::string& text) {
  std::string out;
  bool line_start = true;
  for (char c : text) {
    if (line_start && (c == '.' || c == '\'')) out += "\\&";
    if (c == '\\') out += "\\e";
    else if (c == '-') out += "\\-";
    else out += c;
    line_start = c == '\n';
  }
  return out;
}

// "" -> kvsnap, "server add" -> kvsnap-server-add
std::string page_name(const std::string& path) {
  std::string n = "kvsnap";
  if (!path.empty()) n += '-';
  for (char c : path) n += c == ' ' ? '-' : c;
  return n;
}

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string header(const std::string& name, const std::string& summary) {
  return ".TH " + upper(name) + " 1 \"\" \"kvsnap " KVSNAP_VERSION "\" \"kvsnap manual\"\n.nh\n.ad l\n.SH NAME\n" + roff(name) +
         " \\- " + roff(summary) + "\n";
}

std::string summary_of(const CLI::App* app) {
  const std::string& d = app->get_description();
  const auto cut = d.find_first_of("(;\n");
  std::string s = d.substr(0, cut == std::string::npos ? std::string::npos : cut);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string option_head(const CLI::Option* o) {
  std::string names;
  for (const auto& s : o->get_snames()) names += (names.empty() ? "" : ", ") + std::string("\\fB\\-") + s + "\\fR";
  for (const auto& l : o->get_lnames()) names += (names.empty() ? "" : ", ") + std::string("\\fB\\-\\-") + roff(l) + "\\fR";
  if (o->get_expected_max() != 0 && o->get_type_size_max() != 0) names += " \\fI" + roff(o->get_type_name()) + "\\fR";
  return names;
}

std::string command_page(const Command& c) {
  const std::string path = c.path;
  std::string s = header(page_name(path), summary_of(c.app));
  s += ".SH SYNOPSIS\n.B kvsnap " + roff(path) + "\n";
  if (c.group) {
    s += "\\fICOMMAND\\fR\n";
  } else {
    s += "[\\fIOPTIONS\\fR]";
    for (const CLI::Option* o : c.app->get_options())
      if (o->get_positional() && !o->nonpositional()) s += " \\fI" + roff(upper(o->get_name())) + "\\fR";
    s += "\n";
  }
  s += ".SH DESCRIPTION\n" + roff(c.app->get_description()) + "\n";
  if (c.group) {
    s += ".SH COMMANDS\n";
    for (const CLI::App* sub : c.app->get_subcommands({}))
      s += ".TP\n.B " + roff(sub->get_name()) + "\n" + roff(sub->get_description()) + " (\\fB" +
           roff(page_name(path + " " + sub->get_name())) + "\\fR(1))\n";
  }
  std::string positionals, options;
  for (const CLI::Option* o : c.app->get_options()) {
    if (o->get_positional() && !o->nonpositional()) {
      positionals += ".TP\n.I " + roff(upper(o->get_name())) + "\n" + roff(o->get_description()) + "\n";
    } else {
      options += ".TP\n" + option_head(o) + "\n" + roff(o->get_description()) + "\n";
    }
  }
  if (!positionals.empty()) s += ".SH ARGUMENTS\n" + positionals;
  if (!options.empty()) s += ".SH OPTIONS\n" + options;
  std::string footer = c.app->get_footer();
  while (!footer.empty() && footer.front() == '\n') footer.erase(0, 1);
  if (!footer.empty()) s += ".SH NOTES\n.nf\n" + roff(footer) + "\n.fi\n";
  s += ".SH EXIT STATUS\nAs for every kvsnap command: see \\fBkvsnap\\fR(1).\n";
  s += ".SH SEE ALSO\n\\fBkvsnap\\fR(1)\n";
  return s;
}

std::string main_page(const CLI::App& root) {
  std::string s = header("kvsnap", "keep llama.cpp inference sessions across restarts and cache types");
  s += ".SH SYNOPSIS\n.B kvsnap\n\\fICOMMAND\\fR [\\fIOPTIONS\\fR]\n.SH DESCRIPTION\n" + roff(root.get_description()) +
       "\n.PP\n\\fBkvsnap \\fICOMMAND\\fB \\-\\-help\\fR teaches each command; \\fBkvsnap\\-\\fICOMMAND\\fR(1) is the same "
       "text as a manual page.\n.SH COMMANDS\n";
  for (const Command& c : commands_of(root))
    if (c.path.find(' ') == std::string::npos)
      s += ".TP\n.B " + roff(c.path) + "\n" + roff(c.app->get_description()) + "\n";
  s += ".SH EXIT STATUS\n";
  for (const ExitMeaning& e : kExitMeanings) s += ".TP\n.B " + std::to_string(e.code) + "\n" + roff(e.meaning) + "\n";
  s += ".SH ENVIRONMENT\n.TP\n.B KVSNAP_HOME\nthe store (a directory, or a store config file) when \\-\\-store is not given "
       "(default: $XDG_DATA_HOME/kvsnap, else ~/.local/share/kvsnap)\n.TP\n.B KVSNAP_SIMD\nscalar, avx2, avx512 or neon: lowers the SIMD level "
       "of the conversion kernels and the store's byte shuffle (the output bytes are the same)\n.TP\n"
       ".B KVSNAP_AVX512_HALVES\n1 or 0: whether the avx512 level takes its q8_0 rows as for a CPU that splits 512\\-bit "
       "operations into two halves (AMD Zen 4) or at full width, for benches and tests (the output bytes are the same; "
       "another value is ignored, and kvsnap doctor warns)\n.TP\n"
       ".B KVSNAP_SHA\nopenssl, shani\\-x2, shani\\-x4, avx2\\-x8, avx512\\-x8 or armv8\\-x2: the SHA\\-256 kernel that hashes chunks, for "
       "tests and benches (one this CPU lacks gives the best it has, and kvsnap doctor warns; KVSNAP_SIMD=scalar gives openssl, "
       "KVSNAP_SIMD=avx2 gives avx2\\-x8 for avx512\\-x8; the ids are the same)\n.TP\n.B KVSNAP_PROGRESS_DELAY_MS\nhow long a command runs "
       "before it shows progress on a terminal (default 1000)\n.TP\n.B KVSNAP_ADMIN_KEY\nkvsnap serve: a key that opens its own "
       "routes (/kvsnap/requantize, /kvsnap/usage); with it, or \\-\\-admin\\-key\\-file, the child's API keys do not "
       "(not handed on to llama\\-server)\n";
  s += ".SH SEE ALSO\n";
  std::string refs;
  for (const Command& c : commands_of(root)) refs += (refs.empty() ? "" : ",\n") + ("\\fB" + roff(page_name(c.path)) + "\\fR(1)");
  return s + refs + "\n";
}

struct ManOpts {
  std::vector<std::string> command;  // empty: kvsnap(1)
  std::string dir;                   // every page into DIR
};

Status run_man(const CLI::App& root, const ManOpts& o, std::string& out) {
  const auto all = commands_of(root);
  if (!o.dir.empty() && !o.command.empty())  // it writes every page: a command named beside it was ignored
    return Status::InvalidArgument("--dir writes every page; give it without a command");
  if (!o.dir.empty()) {
    // Each page replaced whole (a reader, or a failed run, never leaves a cut page); the
    // directory synced once after the last.
    AtomicWriteOptions batch;
    batch.sync_dir = false;
    auto write = [&](const std::string& name, const std::string& text) -> Status {
      KV_ASSIGN_OR_RETURN(auto w, AtomicFileWriter::create(cli_io(), o.dir + "/" + name + ".1", batch));
      KV_RETURN_IF_ERROR(w->append(text.data(), text.size()));
      return w->commit();
    };
    KV_RETURN_IF_ERROR(write("kvsnap", main_page(root)));
    for (const Command& c : all) KV_RETURN_IF_ERROR(write(page_name(c.path), command_page(c)));
    KV_RETURN_IF_ERROR(cli_io().sync_dir(o.dir));
    out = "wrote " + std::to_string(all.size() + 1) + " manual pages to " + o.dir + "\n";
    return Status::OK();
  }
  if (o.command.empty()) {
    out = main_page(root);
    return Status::OK();
  }
  std::string path;
  for (const auto& w : o.command) path += (path.empty() ? "" : " ") + w;
  for (const Command& c : all) {
    if (c.path == path) {
      out = command_page(c);
      return Status::OK();
    }
  }
  return Status::InvalidArgument("no command '" + path + "' (kvsnap --help lists them)");
}

}  // namespace

void setup_man(CLI::App& app, int& exit_status) {
  auto o = std::make_shared<ManOpts>();
  auto* sub = app.add_subcommand("man", "Print the manual page of kvsnap or of one command (roff, from the same text "
                                        "as --help)");
  sub->add_option("command", o->command, "the command (e.g. convert, or server add); none: kvsnap(1)");
  sub->add_option("--dir", o->dir, "write every page (kvsnap.1, kvsnap-convert.1, ...) into this directory");
  sub->footer("\nExamples:\n  kvsnap man convert | man -l -\n  kvsnap man --dir ~/.local/share/man/man1\n");
  sub->callback([o, &app, &exit_status]() {
    std::string out;
    exit_status = report("man", run_man(app, *o, out), out);
  });
}

}  // namespace kvsnap::cli
