// Cutting a saved state down to its first N tokens (`kvsnap restore --tokens N`).
//
// A slot that holds a long conversation also holds every shorter prefix of it:
// the K/V rows of token i depend only on tokens 0..i. So a prefix is the same
// file with fewer cells and a shorter token list, and costs no computation.
//
// Supported: sequence files and raw sequence buffers whose kept cells (pos < N)
// are the first cells of each stream, with no media in the token payload. Not
// supported, each with its own kNotSupported message: session files (their
// outputs and logits belong to the last token), recurrent state (it has seen
// every token and cannot be rewound), iSWA (the sliding window of the prefix
// holds cells the full state already evicted), media tokens.
#pragma once

#include <cstdint>

#include "base/io.h"
#include "base/status.h"
#include "format/llama_state.h"

namespace kvsnap {

// The description of the prefix state. Its tensors come from PrefixTensorSource.
// kInvalidArgument when n_tokens is 0 or more than the state holds.
Result<StateFile> plan_prefix(const StateFile& src, uint64_t n_tokens);

// Emits the kept cells' rows (and, for transposed V, each row's first cells)
// from `src` as parsed from `file`.
class PrefixTensorSource final : public TensorSource {
 public:
  PrefixTensorSource(const StateFile& src, const ReadableFile& file) : src_(src), file_(file) {}
  Status emit(const StateFile& target, const TensorRef& ref, ByteSink& out) override;

 private:
  const StateFile& src_;
  const ReadableFile& file_;
};

// plan_prefix + write_state.
Status write_prefix(const StateFile& src, const ReadableFile& file, uint64_t n_tokens, ByteSink& out);

}  // namespace kvsnap
