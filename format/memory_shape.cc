#include "format/memory_shape.h"

namespace kvsnap {

Result<MemoryShape> memory_shape(const ModelProfile& p, const std::string& source_name) {
  KV_ASSIGN_OR_RETURN(auto sections, memory_sections(p));
  MemoryShape m;
  m.ext_bytes = p.cell_ext_bytes;
  m.kv_sections_known = true;
  m.recurrent_known = true;
  m.source = source_name + " (" + p.arch + ")";
  if (!p.layers.empty()) {
    m.hparams = MemoryShape::Hparams{p.n_vocab, p.n_embd, p.n_head, p.n_head_kv, p.n_layer,
                                     p.layers[0].head_dim_k, p.layers[0].head_dim_v, p.arch};
  }
  for (const auto& s : sections) {
    if (s.kind == SectionKind::kRecurrent) {
      m.has_recurrent = true;
      m.recurrent_n_layer = s.n_layer_field;
      m.recurrent_row_elems.clear();
      for (const auto& L : s.layers) m.recurrent_row_elems.push_back(L.n_embd_r);
      for (const auto& L : s.layers) m.recurrent_row_elems.push_back(L.n_embd_s);
      continue;
    }
    KvSectionShape ks;
    for (const auto& L : s.layers) {
      ks.n_embd_k_gqa.push_back(L.n_embd_k_gqa);
      ks.n_embd_v_gqa.push_back(L.n_embd_v_gqa);
      ks.has_v.push_back(L.has_v);
    }
    m.kv_sections.push_back(std::move(ks));
  }
  return m;
}

}  // namespace kvsnap
