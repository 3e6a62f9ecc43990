// The token words at the head of a state file: llama-server's packed payload
// (a -1 word, version, tokens, media positions and chunks) read back into a
// TokenPayload, and the tokens packed into that form again. Plain token lists
// pass through as they are.
#include <string>
#include <vector>

#include "base/byte_order.h"
#include "format/cursor.h"
#include "format/llama_state.h"

namespace kvsnap {

Result<TokenPayload> parse_token_payload(std::vector<int32_t> words) {
  TokenPayload tp;
  if (words.empty() || words[0] != -1) {
    tp.tokens = words;
    tp.words = std::move(words);
    return tp;
  }
  // Packed llama-server payload, read as bytes.
  const size_t nbytes = words.size() * 4;
  std::vector<std::byte> b(nbytes);
  for (size_t i = 0; i < words.size(); ++i) store_le(b.data() + 4 * i, uint32_t(words[i]), 4);
  size_t pos = 4;
  auto rd32 = [&](uint32_t& v, const char* what) -> Status {
    if (nbytes - pos < 4) return Status::Corruption(std::string("packed server token payload: truncated ") + what);
    v = load_le<uint32_t>(b.data() + pos);
    pos += 4;
    return Status::OK();
  };
  KV_RETURN_IF_ERROR(rd32(tp.packed_version, "version"));
  if (tp.packed_version != 1) {
    return Status::NotSupported("packed server token payload version " + std::to_string(tp.packed_version) +
                                " (kvsnap knows version 1)");
  }
  uint32_t n = 0;
  KV_RETURN_IF_ERROR(rd32(n, "token count"));
  if (n > (nbytes - pos) / 4) return Status::Corruption("packed server token payload: token count past the end");
  tp.tokens.resize(n);
  for (size_t k = 0; k < n; ++k) tp.tokens[k] = load_le<int32_t>(b.data() + pos + 4 * k);
  pos += size_t(n) * 4;
  uint32_t m = 0;
  KV_RETURN_IF_ERROR(rd32(m, "media count"));
  if (m > (nbytes - pos) / 4) return Status::Corruption("packed server token payload: media count past the end");
  tp.media_positions.resize(m);
  for (size_t k = 0; k < m; ++k) tp.media_positions[k] = load_le<uint32_t>(b.data() + pos + 4 * k);
  pos += size_t(m) * 4;
  for (uint32_t i = 0; i < m; ++i) {
    uint32_t len = 0;
    KV_RETURN_IF_ERROR(rd32(len, "media chunk length"));
    if (len == 0 || len > nbytes - pos) return Status::Corruption("packed server token payload: media chunk past the end");
    tp.media_chunks.emplace_back(b.begin() + pos, b.begin() + pos + len);
    pos += len;
  }
  // Zero padding to a whole word only (llama-server refuses trailing words).
  if (nbytes - pos >= 4) return Status::Corruption("packed server token payload: trailing data");
  for (size_t i = pos; i < nbytes; ++i) {
    if (b[i] != std::byte{0}) return Status::Corruption("packed server token payload: non-zero padding");
  }
  tp.packed = true;
  tp.words = std::move(words);
  return tp;
}

std::vector<int32_t> pack_server_tokens(const std::vector<int32_t>& tokens,
                                        const std::vector<uint32_t>& media_positions,
                                        const std::vector<std::vector<std::byte>>& media_chunks) {
  std::vector<std::byte> b;
  auto put = [&](uint32_t v) { put_u32(b, v); };
  put(0xffffffffu);
  put(1);
  put(uint32_t(tokens.size()));
  for (int32_t t : tokens) put(uint32_t(t));
  put(uint32_t(media_positions.size()));
  for (uint32_t p : media_positions) put(p);
  for (const auto& ch : media_chunks) {
    put(uint32_t(ch.size()));
    b.insert(b.end(), ch.begin(), ch.end());
  }
  b.resize((b.size() + 3) / 4 * 4, std::byte{0});
  std::vector<int32_t> words(b.size() / 4);
  for (size_t i = 0; i < words.size(); ++i) words[i] = load_le<int32_t>(b.data() + 4 * i);
  return words;
}

}  // namespace kvsnap
