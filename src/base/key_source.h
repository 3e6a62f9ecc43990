// Where an encrypted store's master key comes from: a key file or a key command
// (docs/store.md, "Encryption at rest"). Both end in parse_master_key
// (base/chunk_cipher.h): 32 raw bytes or 64 hex digits plus an optional newline.
//
// These two talk to the OS directly rather than through Io: the key file's permission check
// needs fstat(2) of the descriptor that is then read (no window for a swap between the check
// and the read), and a command is a process, which Io does not model. kvsnap never writes keys.
#pragma once

#include <cstddef>
#include <string>

#include "base/chunk_cipher.h"
#include "base/status.h"

namespace kvsnap {

// Reads the key from `path` (symbolic links followed, as for a mounted secret).
// Refused, with the remedy in the message:
//  - a file any group or other user may read, write or run (mode & 077, as ssh refuses private
//    keys): "chmod 600"; a secret mounted 0644 by an orchestrator is read on purpose with a key
//    command ("cat FILE");
//  - anything but a regular file, a file over 4 KiB, bytes that are no key (parse_master_key).
// kNotFound when it does not exist, kIOError when it cannot be read, kInvalidArgument otherwise.
Result<MasterKey> load_key_file(const std::string& path);

struct KeyCommandOptions {
  size_t max_output = 4096;  // more on stdout is refused (and the command stopped)
  // A command still running then is killed (SIGKILL) and refused. Killed is the process kvsnap
  // started (sh): it stays in kvsnap's process group so that it may prompt on the terminal,
  // and processes it left behind are its own.
  int timeout_ms = 30000;
};

// Runs `command` with /bin/sh -c (stdin and stderr are kvsnap's, so it may prompt), reads its
// stdout and parses the key from it. A non-zero exit, death by a signal, the timeout and an
// over-long output are kInvalidArgument naming the command and what happened, kIOError when it
// cannot be started. The command's output never appears in a message.
Result<MasterKey> run_key_command(const std::string& command, const KeyCommandOptions& opts = {});

}  // namespace kvsnap
