#include "serve/usage.h"

#include "format/ggml_types.h"
#include "format/llama_state.h"

namespace kvsnap {

namespace {

// One layer of one stream: how many cells, how many values per K row and per V row.
struct RowShape {
  uint64_t cells = 0, k_elems = 0, v_elems = 0;
  bool has_v = false;
};

Result<std::vector<RowShape>> row_shapes(const StateFile& f) {
  std::vector<RowShape> out;
  for (const auto& sec : f.memory.kv) {
    for (const auto& st : sec.streams) {
      for (const auto& L : st.layers) {
        RowShape r;
        r.cells = st.cell_count;
        auto k = layer_n_embd_k(L);
        if (!k) return Status::Mismatch("a K row of the stored state is not whole values of its type");
        r.k_elems = *k;
        r.has_v = L.has_v;
        if (L.has_v) {
          auto v = layer_n_embd_v(L, st.v_trans);
          if (!v) return Status::Mismatch("a V row of the stored state is not whole values of its type");
          r.v_elems = *v;
        }
        out.push_back(r);
      }
    }
  }
  return out;
}

std::optional<uint64_t> rows_bytes(const std::vector<RowShape>& shapes, const TypeLayout& kt, const TypeLayout& vt) {
  uint64_t total = 0;
  for (const RowShape& r : shapes) {
    auto k = row_bytes(kt, r.k_elems);
    if (!k.ok()) return std::nullopt;
    total += *k * r.cells;
    if (!r.has_v) continue;
    auto v = row_bytes(vt, r.v_elems);
    if (!v.ok()) return std::nullopt;
    total += *v * r.cells;
  }
  return total;
}

}  // namespace

void SlotBook::put(int slot, SlotRecord r) {
  std::lock_guard<std::mutex> l(mu_);
  slots_[slot] = std::move(r);
}

void SlotBook::forget(int slot) {
  std::lock_guard<std::mutex> l(mu_);
  slots_.erase(slot);
}

std::map<int, SlotRecord> SlotBook::all() {
  std::lock_guard<std::mutex> l(mu_);
  return slots_;
}

void SlotBook::clear() {
  std::lock_guard<std::mutex> l(mu_);
  slots_.clear();
}

Result<std::vector<PairSize>> sizes_at_every_pair(Store& store, int64_t id) {
  KV_ASSIGN_OR_RETURN(auto snap, store.open_snapshot(std::to_string(id)));
  KV_ASSIGN_OR_RETURN(StateFile f, snap->reader().parse_original());
  KV_ASSIGN_OR_RETURN(auto shapes, row_shapes(f));
  const KvTotals now = kv_totals(f);
  const uint64_t outside_rows = f.file_size - now.k_bytes - now.v_bytes;
  std::vector<PairSize> out;
  for (const TypeLayout& kt : kv_cache_types()) {
    for (const TypeLayout& vt : kv_cache_types()) {
      PairSize p{std::string(kt.name), std::string(vt.name), rows_bytes(shapes, kt, vt)};
      if (p.bytes) *p.bytes += outside_rows;
      out.push_back(std::move(p));
    }
  }
  return out;
}

std::optional<uint64_t> size_at(const std::vector<PairSize>& sizes, const std::string& ctk, const std::string& ctv) {
  for (const PairSize& p : sizes)
    if (p.ctk == ctk && p.ctv == ctv) return p.bytes;
  return std::nullopt;
}

}  // namespace kvsnap
