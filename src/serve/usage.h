// What each slot of the child holds, as far as kvsnap knows (the snapshot it
// last saved from the slot or restored into it), and what that state would
// take at every ctk/ctv pair llama-server accepts: GET /kvsnap/usage and the
// estimates of a requantize's dry run.
//
// Promises:
//   - a slot's bytes are measured, never estimated: the state the child wrote
//     (a save) or the file kvsnap gave it (a restore, converted);
//   - the sizes at other types come from the snapshot's own layout (its cells
//     and row widths, read from the stored file) and the type table's row
//     sizes (format/ggml_types.h row_bytes): the bytes outside the K/V rows
//     (headers, cells, tokens) stay, the rows change size; a row that is not
//     whole blocks of a type has no size at it (nullopt);
//   - the book forgets everything when the child restarts (its slots are empty).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "store/store.h"

namespace kvsnap {

struct SlotRecord {
  int64_t snapshot = 0;    // the snapshot with the slot's content
  std::string ns;          // its namespace (serve.ns)
  uint64_t n_tokens = 0;
  uint64_t bytes = 0;      // the slot's state at its current types
  std::string ctk, ctv;    // its current types
  bool v_rows = false;     // V stored per cell (flash attention)
  std::string how;         // "saved" or "restored"
};

class SlotBook {
 public:
  void put(int slot, SlotRecord r);
  // The slot holds something no snapshot has (a conversation not kept): a requantize must not put
  // the slot's previous snapshot back into it, nor report its size.
  void forget(int slot);
  std::map<int, SlotRecord> all();
  void clear();

 private:
  std::mutex mu_;
  std::map<int, SlotRecord> slots_;
};

struct PairSize {
  std::string ctk, ctv;
  std::optional<uint64_t> bytes;  // the whole state (as llama.cpp writes it) at these types
};

// Sizes of snapshot `id`'s state at every pair of kv_cache_types() (ctk-major). Reads the stored file's
// headers and cell list (a few chunks), not its rows.
Result<std::vector<PairSize>> sizes_at_every_pair(Store& store, int64_t id);
// The entry for (ctk, ctv), nullopt when absent or not whole blocks.
std::optional<uint64_t> size_at(const std::vector<PairSize>& sizes, const std::string& ctk, const std::string& ctv);

}  // namespace kvsnap
