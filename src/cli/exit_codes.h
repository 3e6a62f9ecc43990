// The one place where error codes become process exit codes (docs/cli.md).
#pragma once

#include <cstdio>
#include <string>

#include "base/remedy.h"
#include "base/status.h"
#include "base/text.h"

namespace kvsnap::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;
// An exception reached main: a bug in kvsnap, never an answer about the input.
inline constexpr int kExitInternal = 70;
// Ctrl-C (SIGINT), SIGTERM or SIGHUP stopped the command; what it was writing was removed. main
// then ends the process by that signal (cli/progress.h end_by_interrupting_signal), so a shell
// reports 128 + N; this status is what is left when no signal was taken (128 + SIGINT).
inline constexpr int kExitInterrupted = 130;

// What each exit status means, for kvsnap(1) (docs/cli.md keeps the same table).
struct ExitMeaning {
  int code;
  const char* meaning;
};
inline constexpr ExitMeaning kExitMeanings[] = {
    {0, "success"},
    {2, "bad arguments, and every usage error (unknown option or command, missing or malformed value)"},
    {3, "corrupt input: truncated, a bad count, a damaged field"},
    {4, "not supported: an input kvsnap does not handle (unknown version, or another kind of file: unknown magic)"},
    {5, "mismatch: the file and the model (or target) disagree"},
    {6, "ambiguous: more than one layout fits (pass --model), the result depends on a rotation nothing decides "
        "(pass --source-build/--src-rotation, or --target-build/--dst-rotation), or a uuid prefix names several "
        "snapshots"},
    {7, "I/O error, or out of memory"},
    {8, "not found: a file, snapshot, model or server slot that does not exist"},
    {70, "internal error: an exception reached main (a kvsnap bug)"},
    {129, "interrupted by SIGHUP (the terminal closed): what it was writing is removed, and the process ends by "
          "the signal (a shell reports 128 + N)"},
    {130, "interrupted by Ctrl-C (SIGINT): what it was writing is removed, and the process ends by the signal"},
    {143, "interrupted by SIGTERM: what it was writing is removed, and the process ends by the signal"},
};

// Codes 0..8 are the C API's kvsnap_status values (capi/kvsnap.h): tests/cli/exit_codes_test.cc
// pins each one, so the two front ends cannot drift apart.
constexpr int exit_code(Code c) {
  switch (c) {
    case Code::kOk: return 0;
    case Code::kInvalidArgument: return 2;
    case Code::kCorruption: return 3;
    case Code::kNotSupported: return 4;
    case Code::kMismatch: return 5;
    case Code::kAmbiguous: return 6;
    case Code::kIOError: return 7;
    case Code::kNotFound: return 8;
    case Code::kInterrupted: return kExitInterrupted;
  }
  return 1;
}
inline int exit_code(const Status& s) { return exit_code(s.code()); }

// Every code's exit status is explained in kExitMeanings (kvsnap(1), docs/cli.md).
constexpr bool exit_code_explained(Code c) {
  for (const ExitMeaning& m : kExitMeanings) {
    if (m.code == exit_code(c)) return true;
  }
  return false;
}
static_assert(exit_code_explained(Code::kOk) && exit_code_explained(Code::kCorruption) &&
              exit_code_explained(Code::kNotSupported) && exit_code_explained(Code::kInvalidArgument) &&
              exit_code_explained(Code::kIOError) && exit_code_explained(Code::kNotFound) &&
              exit_code_explained(Code::kMismatch) && exit_code_explained(Code::kAmbiguous) &&
              exit_code_explained(Code::kInterrupted));

// Prints a command's result the one way every command does: output to
// stdout on success, "kvsnap CMD: <kind>: <message>" to stderr otherwise.
// Returns the process exit code.
// Remedies the layers below name ("{--model GGUF}", base/remedy.h) are shown as the flags they are.
// `lacking`: flags this command does not take; an aside offering only those is dropped
// (drop_remedy_asides).
inline int report(const char* command, const Status& s, const std::string& out,
                  std::initializer_list<std::string_view> lacking = {}) {
  auto render = [&](std::string_view t) { return render_remedies_as_flags(drop_remedy_asides(t, lacking)); };
  if (!s.ok()) {
    // Errors quote what files, archives and servers hold (names, tags, paths): no control
    // character of theirs reaches the terminal (base/text.h shown_text; lines kept).
    std::fprintf(stderr, "kvsnap %s: %s\n", command, shown_text(render(s.ToString()), /*keep_lines=*/true).c_str());
    return exit_code(s);
  }
  // A result that did not reach stdout (a full disk, a closed pipe) is no success: a script would
  // take the empty or cut output for the whole. It quotes names kvsnap did not write (a file's, a
  // model's architecture): shown as errors are (JSON escapes its own, so it passes unchanged).
  if (std::fputs(shown_text(render(out), /*keep_lines=*/true).c_str(), stdout) < 0 || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "kvsnap %s: I/O error: writing the result to stdout failed\n", command);
    return exit_code(Status::IOError(""));
  }
  return kExitOk;
}

// As report(), for commands whose output lists what failed (migrate's per-file outcomes, verify's
// problems): on failure that output goes to stdout too, before the error, remedies rendered alike.
inline int report_with_output(const char* command, const Status& s, const std::string& out,
                              std::initializer_list<std::string_view> lacking = {}) {
  if (!s.ok() && !out.empty()) std::fputs(render_remedies_as_flags(drop_remedy_asides(out, lacking)).c_str(), stdout);
  return report(command, s, out, lacking);
}

}  // namespace kvsnap::cli
