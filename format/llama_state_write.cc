// Writes a parsed StateFile back out in its own era's layout: the header of
// each kind, the KV sections with tensors streamed from a TensorSource (checked
// for size), and the opaque ranges (outputs, recurrent state) copied verbatim.
// The reader lives in llama_state.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "format/cursor.h"
#include "format/llama_state.h"
#include "format/llama_state_internal.h"

namespace kvsnap {

using namespace llama_state_detail;

Status copy_range(const ReadableFile& src, ByteRange range, ByteSink& out) {
  constexpr uint64_t kPiece = 1 << 20;
  std::vector<std::byte> buf(std::min<uint64_t>(kPiece, range.size));
  uint64_t done = 0;
  while (done < range.size) {
    const uint64_t n = std::min<uint64_t>(kPiece, range.size - done);
    std::span<std::byte> piece(buf.data(), n);
    KV_RETURN_IF_ERROR(src.read_at(range.offset + done, piece));
    KV_RETURN_IF_ERROR(out.append(piece));
    done += n;
  }
  return Status::OK();
}

Status CopyTensorSource::emit(const StateFile& target, const TensorRef& ref, ByteSink& out) {
  const KvLayer& L = target.memory.kv.at(ref.section).streams.at(ref.stream).layers.at(ref.layer);
  return copy_range(src_, ref.is_v ? L.v : L.k, out);
}

namespace {

// Forwards to a sink and counts, so the writer can check what a TensorSource emitted.
class CountingForwarder final : public ByteSink {
 public:
  explicit CountingForwarder(ByteSink& out) : out_(out) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> d) override {
    count += d.size();
    return out_.append(d);
  }
  uint64_t count = 0;

 private:
  ByteSink& out_;
};

Status write_outputs(const SessionOutputs& o, const ReadableFile& src, ByteSink& out) {
  KV_RETURN_IF_ERROR(write_u32(out, o.n_outputs));
  KV_RETURN_IF_ERROR(copy_range(src, o.output_pos, out));
  KV_RETURN_IF_ERROR(write_u64(out, o.logits_size));
  KV_RETURN_IF_ERROR(copy_range(src, o.logits, out));
  KV_RETURN_IF_ERROR(write_u64(out, o.embd_size));
  return copy_range(src, o.embd, out);
}

Status write_kv_section(const StateFile& file, size_t si, TensorSource& tensors, ByteSink& out) {
  const KvSection& sec = file.memory.kv[si];
  if (sec.stream_prefix) {
    KV_RETURN_IF_ERROR(write_u32(out, uint32_t(sec.streams.size())));
  } else if (sec.streams.size() != 1) {
    return Status::InvalidArgument("writer: a KV section without the n_stream prefix holds exactly one stream");
  }
  for (size_t s = 0; s < sec.streams.size(); ++s) {
    const KvStream& st = sec.streams[s];
    KV_RETURN_IF_ERROR(write_u32(out, st.cell_count));
    // Without the prefix (b3543..b5869) an empty stream still has its layers' headers (parse_kv_stream).
    if (st.cell_count == 0 && sec.stream_prefix) continue;
    if (st.cell_count == 0 && st.layers.empty()) {
      return Status::NotSupported("writer: an empty KV cache in a layout before b6122 needs its layers' types and row "
                                  "sizes, which the input does not hold; write it in the current format");
    }
    if (st.cells.size() != st.cell_count) return Status::InvalidArgument("writer: cell list does not match cell_count");
    std::vector<std::byte> meta;
    for (const CellMeta& m : st.cells) {
      put_i32(meta, m.pos);
      put_u32(meta, uint32_t(m.seq_ids.size()));
      for (uint32_t e = 0; e < sec.ext_bytes / 4; ++e) put_i32(meta, m.ext[e]);
      for (int32_t id : m.seq_ids) put_i32(meta, id);
      if (meta.size() >= (1 << 16)) {
        KV_RETURN_IF_ERROR(out.append(meta));
        meta.clear();
      }
    }
    put_u32(meta, st.v_trans);
    put_u32(meta, uint32_t(st.layers.size()));
    KV_RETURN_IF_ERROR(out.append(meta));
    const uint64_t n = st.cell_count;
    for (size_t il = 0; il < st.layers.size(); ++il) {
      const KvLayer& L = st.layers[il];
      KV_RETURN_IF_ERROR(write_i32(out, L.k_type));
      KV_RETURN_IF_ERROR(write_u64(out, L.k_row_bytes));
      KV_RETURN_IF_ERROR(emit_checked(file, tensors, {si, s, il, false}, n * L.k_row_bytes, out));
    }
    for (size_t il = 0; il < st.layers.size(); ++il) {
      const KvLayer& L = st.layers[il];
      if (!L.has_v) continue;
      KV_RETURN_IF_ERROR(write_i32(out, L.v_type));
      if (!st.v_trans) {
        KV_RETURN_IF_ERROR(write_u64(out, L.v_row_bytes));
        KV_RETURN_IF_ERROR(emit_checked(file, tensors, {si, s, il, true}, n * L.v_row_bytes, out));
      } else {
        KV_RETURN_IF_ERROR(write_u32(out, L.v_elem_bytes));
        KV_RETURN_IF_ERROR(write_u32(out, L.n_embd_v_gqa));
        KV_RETURN_IF_ERROR(
            emit_checked(file, tensors, {si, s, il, true}, n * L.n_embd_v_gqa * uint64_t(L.v_elem_bytes), out));
      }
    }
  }
  return Status::OK();
}

// ggsq v1 (b3166): see read_seq_v1. check_seq_v1 has refused what the layout cannot hold.
Status write_seq_v1(const StateFile& file, TensorSource& tensors, ByteSink& out) {
  const KvStream& st = file.memory.kv[0].streams[0];
  const uint64_t n_embd_v = *layer_n_embd_v(st.layers[0], st.v_trans);
  std::vector<std::byte> meta;
  put_u32(meta, 8);
  put_u32(meta, st.cell_count);
  put_u32(meta, uint32_t(st.layers.size()));
  put_u32(meta, uint32_t(n_embd_v));
  for (const CellMeta& m : st.cells) put_i32(meta, m.pos);
  KV_RETURN_IF_ERROR(out.append(meta));
  const uint64_t n = st.cell_count;
  for (size_t il = 0; il < st.layers.size(); ++il) {
    const KvLayer& L = st.layers[il];
    KV_RETURN_IF_ERROR(write_i32(out, L.k_type));
    KV_RETURN_IF_ERROR(write_u64(out, L.k_row_bytes));
    KV_RETURN_IF_ERROR(emit_checked(file, tensors, {0, 0, il, false}, n * L.k_row_bytes, out));
  }
  for (size_t il = 0; il < st.layers.size(); ++il) {
    const KvLayer& L = st.layers[il];
    KV_RETURN_IF_ERROR(write_i32(out, L.v_type));
    KV_RETURN_IF_ERROR(write_u64(out, st.v_trans ? L.v_elem_bytes : L.v_row_bytes));
    const uint64_t bytes = st.v_trans ? n * L.n_embd_v_gqa * uint64_t(L.v_elem_bytes) : n * L.v_row_bytes;
    KV_RETURN_IF_ERROR(emit_checked(file, tensors, {0, 0, il, true}, bytes, out));
  }
  return Status::OK();
}

// u32 length, then the bytes.
Status write_text(const std::string& text, ByteSink& out) {
  KV_RETURN_IF_ERROR(write_u32(out, uint32_t(text.size())));
  return out.append(text.data(), text.size());
}

Status write_arch(const std::string& arch, ByteSink& out) {
  // llama.cpp refuses a session of another arch ("wrong model arch"), an empty one too, and so does
  // kvsnap's reader (1..256 bytes): a state read without its arch (a v6 session's shape from a
  // snapshot) is not written into a layout that records one.
  if (arch.empty() || arch.size() > 256)
    return Status::InvalidArgument("writer: the output records the model's arch, and the input names none; give {--model GGUF}");
  return write_text(arch, out);
}

}  // namespace

namespace llama_state_detail {

Status emit_checked(const StateFile& file, TensorSource& tensors, const TensorRef& ref, uint64_t expect,
                    ByteSink& out) {
  CountingForwarder fw(out);
  KV_RETURN_IF_ERROR(tensors.emit(file, ref, fw));
  if (fw.count != expect) {
    return Status::InvalidArgument("writer: " + std::string(ref.is_v ? "V" : "K") + " tensor of section " +
                                   std::to_string(ref.section) + " stream " + std::to_string(ref.stream) +
                                   " layer " + std::to_string(ref.layer) + " produced " + std::to_string(fw.count) +
                                   " bytes, expected " + std::to_string(expect));
  }
  return Status::OK();
}

Status write_words(const std::vector<int32_t>& words, ByteSink& out) {
  KV_RETURN_IF_ERROR(write_u32(out, uint32_t(words.size())));
  std::vector<std::byte> b;
  b.reserve(words.size() * 4);
  for (int32_t w : words) put_i32(b, w);
  return out.append(b);
}

}  // namespace llama_state_detail

// What b3166's ggsq v1 layout cannot hold, refused before a byte is written.
static Status check_seq_v1(const StateFile& file) {
  const auto refuse = [](const std::string& what) {
    return Status::NotSupported("a ggsq v1 file (llama.cpp b3166) cannot hold this state: " + what +
                                "; write a later format ({--format current}, or {--target-build} of the build "
                                "that will load it)");
  };
  const auto& kv = file.memory.kv;
  if (file.memory.recurrent) return refuse("it has a recurrent state (a recurrent or hybrid model)");
  if (kv.size() != 1) {
    return refuse("it has " + std::to_string(kv.size()) +
                  " KV caches (an iSWA model's: sliding-window and full layers), v1 holds one");
  }
  if (kv[0].streams.size() != 1) return refuse("it has " + std::to_string(kv[0].streams.size()) + " streams, v1 holds one");
  if (kv[0].ext_bytes) return refuse("its cells carry " + std::to_string(kv[0].ext_bytes) + "-byte M-RoPE extras");
  const KvStream& st = kv[0].streams[0];
  if (st.layers.empty() || st.cells.size() != st.cell_count) {
    return Status::InvalidArgument("writer: a ggsq v1 file needs its layers and cell list");
  }
  for (const CellMeta& m : st.cells) {
    if (!m.seq_ids.empty()) return Status::InvalidArgument("writer: ggsq v1 cells carry no seq id");
  }
  const std::optional<uint64_t> n_embd_v = layer_n_embd_v(st.layers[0], st.v_trans);
  for (size_t il = 0; il < st.layers.size(); ++il) {
    const KvLayer& L = st.layers[il];
    if (!L.has_v) return refuse("layer " + std::to_string(il) + " has no V, v1 stores V for every layer");
    const std::optional<uint64_t> w = layer_n_embd_v(L, st.v_trans);
    if (!n_embd_v || w != n_embd_v) {
      return refuse("layer " + std::to_string(il) + "'s V is " + std::to_string(w.value_or(0)) +
                    " wide and layer 0's " + std::to_string(n_embd_v.value_or(0)) +
                    ", v1 has one n_embd_v_gqa for every layer");
    }
  }
  return Status::OK();
}

Status check_writable(const StateFile& file) {
  if (file.kind == StateKind::kSeqFile && file.version == 1) return check_seq_v1(file);
  return Status::OK();
}

Status write_state(const StateFile& file, TensorSource& tensors, const ReadableFile& opaque_src, ByteSink& sink) {
  BufferedSink out(sink);
  KV_RETURN_IF_ERROR(check_writable(file));  // nothing reaches `sink` when the layout cannot hold the state
  switch (file.kind) {
    case StateKind::kSeqFile:
      KV_RETURN_IF_ERROR(write_u32(out, kMagicGgsq));
      KV_RETURN_IF_ERROR(write_u32(out, file.version));
      KV_RETURN_IF_ERROR(write_words(file.tokens.words, out));
      if (file.version == 1) {
        KV_RETURN_IF_ERROR(write_seq_v1(file, tensors, out));
        return out.flush();
      }
      break;
    case StateKind::kSessionFile:
      KV_RETURN_IF_ERROR(write_u32(out, kMagicGgsn));
      KV_RETURN_IF_ERROR(write_u32(out, file.version));
      if (file.version == 6) {
        KV_RETURN_IF_ERROR(write_session_v6(file, tensors, opaque_src, out));
        return out.flush();
      }
      if (file.legacy) return Status::InvalidArgument("writer: only ggsn v6 sessions hold b3166's legacy header");
      KV_RETURN_IF_ERROR(write_words(file.tokens.words, out));
      KV_RETURN_IF_ERROR(write_arch(file.arch, out));
      if (file.version == 8) {
        if (file.rng.empty() || !file.outputs) {
          return Status::InvalidArgument("writer: a ggsn v8 session needs its RNG state and an outputs block");
        }
        KV_RETURN_IF_ERROR(write_text(file.rng, out));
      } else if (!file.rng.empty()) {
        return Status::InvalidArgument("writer: only ggsn v8 sessions hold an RNG state");
      }
      // v9 sessions of b8121 and older hold outputs; those of b8179..b10375 do not; v8 always.
      if (file.outputs) {
        if (file.version != 9 && file.version != 8) return Status::InvalidArgument("writer: only v8/v9 sessions hold outputs");
        KV_RETURN_IF_ERROR(write_outputs(*file.outputs, opaque_src, out));
      }
      break;
    case StateKind::kRawSeq:
      if (file.raw_seq_tagged) {
        KV_RETURN_IF_ERROR(write_u32(out, kRawSeqMagic));
        KV_RETURN_IF_ERROR(write_i32(out, file.raw_seq_id));
      }
      break;
    case StateKind::kRawContext:
      KV_RETURN_IF_ERROR(write_arch(file.arch, out));
      if (file.outputs) KV_RETURN_IF_ERROR(write_outputs(*file.outputs, opaque_src, out));
      break;
  }
  for (size_t si = 0; si < file.memory.kv.size(); ++si) {
    KV_RETURN_IF_ERROR(write_kv_section(file, si, tensors, out));
  }
  if (file.memory.recurrent) KV_RETURN_IF_ERROR(copy_range(opaque_src, file.memory.recurrent->range, out));
  return out.flush();
}

}  // namespace kvsnap
