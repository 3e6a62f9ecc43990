#include "base/stale_temps.h"

#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "base/io.h"
#include "base/os.h"

namespace kvsnap {

// A name kvsnap gives its temporaries: `<file>.kvsnap-tmp-<pid>-<n>...` (base/io.h's
// unique_suffix), or the kept slot scratch file. Only these are taken for kvsnap's own: any other
// name holding the infix is a file like the others (`x.kvsnap-tmp-notapid` was removed as stale).
// The last infix decides: a slot file restore --server is still writing is the temporary of a
// temporary (`kvsnap-restore.kvsnap-tmp-<pid>-<n>.bin.kvsnap-tmp-<pid>-<m>`, SlotFileWriter's
// name for server_flows' file), and was taken for a slot file to convert.
// Returns the pid, 0 for the scratch file, nullopt for any other name.
std::optional<long> kvsnap_temp_pid(const std::string& name) {
  if (name == kKeptScratchName) return 0;
  const auto at = name.rfind(kTempInfix);
  if (at == std::string::npos) return std::nullopt;
  const size_t digits = at + kTempInfix.size();
  size_t end = digits;
  while (end < name.size() && end - digits < 10 && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == digits || end >= name.size() || name[end] != '-') return std::nullopt;
  const long pid = std::strtol(name.c_str() + digits, nullptr, 10);
  if (pid <= 0) return std::nullopt;
  // Then unique_suffix's random number to the end, or to ".bin" (server_flows.h's slot files):
  // `chat.kvsnap-tmp-123-old.bin` is a user's file, not a temporary.
  size_t random = end + 1, stop = random;
  while (stop < name.size() && stop - random < 20 && name[stop] >= '0' && name[stop] <= '9') ++stop;
  if (stop == random) return std::nullopt;
  const std::string_view rest = std::string_view(name).substr(stop);
  if (!rest.empty() && rest != ".bin") return std::nullopt;
  return pid;
}

// A temporary of a process that no longer runs (the scratch file: always; it is a cache). A
// process that runs under the temporary's pid, is not a kvsnap and started over a minute after
// the temporary was last written is not its writer: the system gave the dead writer's pid to
// another program (process_name, process_start_time; where the system does not say, such a
// temporary is taken as in use). Both, since the times alone can mislead: a clock set forward by
// more than the minute, or a network file system whose server's clock lags, would make a live
// writer's temporary look older than its process (a program using libkvsnap under another name
// is then still exposed; its rename would fail, nothing is lost).
bool is_stale_temp(long pid, std::optional<int64_t> written_ns) {
  if (pid == 0 || pid > std::numeric_limits<pid_t>::max()) return true;  // no process has that pid
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return true;
  if (!written_ns || process_name(pid_t(pid)).value_or("kvsnap") == "kvsnap") return false;
  const std::optional<double> started = process_start_time(pid_t(pid));
  return started && *started > double(*written_ns) / 1e9 + 60.0;
}

}  // namespace kvsnap
