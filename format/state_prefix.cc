#include "format/state_prefix.h"

#include <string>

namespace kvsnap {

namespace {

Status unsupported(const StateFile& src, const std::string& why) {
  return Status::NotSupported("cannot restore a token prefix of this state (" + std::string(kind_name(src.kind)) +
                              "): " + why);
}

Status check_prefixable(const StateFile& src) {
  if (src.kind == StateKind::kSessionFile || src.kind == StateKind::kRawContext)
    return unsupported(src, "a session holds the outputs of its last token; save a slot (sequence) file instead");
  if (src.memory.recurrent)
    return unsupported(src, "the model's recurrent state has seen every token and cannot be rewound");
  if (src.memory.kv.size() != 1)
    return unsupported(src, "with a sliding-window (iSWA) cache, the window of a prefix holds cells the saved "
                            "state no longer has");
  if (!src.tokens.media_positions.empty())
    return unsupported(src, "the prompt holds media (image/audio) chunks");
  return Status::OK();
}

// The first cells whose position is below n_tokens; they must come first.
Result<uint32_t> kept_cells(const KvStream& st, uint64_t n_tokens, size_t stream) {
  uint32_t kept = 0;
  while (kept < st.cell_count && uint64_t(st.cells[kept].pos) < n_tokens && st.cells[kept].pos >= 0) ++kept;
  for (uint32_t i = kept; i < st.cell_count; ++i) {
    if (st.cells[i].pos >= 0 && uint64_t(st.cells[i].pos) < n_tokens)
      return Status::NotSupported("cannot restore a token prefix: in stream " + std::to_string(stream) + ", cell " +
                                  std::to_string(i) + " (pos " + std::to_string(st.cells[i].pos) +
                                  ") comes after a cell of a later position; the cells are not in prompt order");
  }
  return kept;
}

Result<TokenPayload> prefix_tokens(const TokenPayload& tp, uint64_t n_tokens) {
  TokenPayload out;
  std::vector<int32_t> toks(tp.tokens.begin(), tp.tokens.begin() + std::ptrdiff_t(n_tokens));
  if (tp.packed) return parse_token_payload(pack_server_tokens(toks, {}, {}));
  return parse_token_payload(std::move(toks));
}

}  // namespace

Result<StateFile> plan_prefix(const StateFile& src, uint64_t n_tokens) {
  KV_RETURN_IF_ERROR(check_prefixable(src));
  const uint64_t have = src.tokens.tokens.size();
  if (n_tokens == 0 || n_tokens > have)
    return Status::InvalidArgument("{--tokens} " + std::to_string(n_tokens) + ": the state holds " +
                                   std::to_string(have) + " tokens; ask for 1.." + std::to_string(have));
  StateFile dst = src;
  KV_ASSIGN_OR_RETURN(dst.tokens, prefix_tokens(src.tokens, n_tokens));
  KvSection& sec = dst.memory.kv[0];
  for (size_t s = 0; s < sec.streams.size(); ++s) {
    KvStream& st = sec.streams[s];
    if (st.cell_count == 0) continue;
    KV_ASSIGN_OR_RETURN(uint32_t kept, kept_cells(st, n_tokens, s));
    st.cell_count = kept;
    st.cells.resize(kept);
    if (kept == 0) st.layers.clear();
  }
  return dst;
}

Status PrefixTensorSource::emit(const StateFile& target, const TensorRef& ref, ByteSink& out) {
  const KvStream& from = src_.memory.kv.at(ref.section).streams.at(ref.stream);
  const KvLayer& L = from.layers.at(ref.layer);
  const uint64_t kept = target.memory.kv.at(ref.section).streams.at(ref.stream).cell_count;
  if (!ref.is_v) return copy_range(file_, {L.k.offset, kept * L.k_row_bytes}, out);
  if (!from.v_trans) return copy_range(file_, {L.v.offset, kept * L.v_row_bytes}, out);
  // Transposed V: n_embd_v_gqa rows of cell_count elements; keep each row's first cells.
  const uint64_t row = uint64_t(from.cell_count) * L.v_elem_bytes;
  for (uint64_t d = 0; d < L.n_embd_v_gqa; ++d) {
    KV_RETURN_IF_ERROR(copy_range(file_, {L.v.offset + d * row, kept * L.v_elem_bytes}, out));
  }
  return Status::OK();
}

Status write_prefix(const StateFile& src, const ReadableFile& file, uint64_t n_tokens, ByteSink& out) {
  KV_ASSIGN_OR_RETURN(StateFile dst, plan_prefix(src, n_tokens));
  PrefixTensorSource tensors(src, file);
  return write_state(dst, tensors, file, out);
}

}  // namespace kvsnap
