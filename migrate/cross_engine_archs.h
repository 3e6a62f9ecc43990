// Which llama.cpp architectures move between llama.cpp and mlx-lm, and how their K rows map
// (issue 15 part 4). One row per llama.cpp arch, each audited against both engines' sources:
//   - llama.cpp 3.22.1: src/llama-model.cpp llama_model_rope_type (NORM: pairs 2j, 2j+1; NEOX:
//     pairs j, j+n_rot/2) and the HF -> GGUF converter class of the arch (conversion/*.py), which
//     may permute the Q/K projection rows (LlamaModel.permute: per KV head, split halves ->
//     interleaved pairs);
//   - mlx-lm 0.32.2: the module that runs the HF checkpoint (mlx_lm/models/*.py), its RoPE
//     `traditional` flag (True: pairs 2j, 2j+1; False: pairs j, j+dims/2) and how many dims it
//     ropes.
// The cached K is the post-RoPE projection, so its layout differs between the engines exactly by
// the converter's row permutation: kPermute when it permuted (and the two ropes then agree pair for
// pair), kCopy when it did not (llama.cpp NORM with mlx-lm traditional=True, or NEOX with
// traditional=False). An arch not in the table is refused by name: a rope kind alone does not say
// what its converter did to Q/K.
#pragma once

#include <span>
#include <string>

#include "base/status.h"
#include "format/model_profile.h"

namespace kvsnap {

enum class KMap { kCopy, kPermute };

struct CrossEngineArch {
  const char* arch;          // llama.cpp's general.architecture
  RopeKind rope;             // llama_model_rope_type
  bool converter_permutes;   // the HF -> GGUF converter permuted Q/K rows
  const char* mlx_module;    // mlx_lm/models/<module>.py
  bool mlx_traditional;      // its RoPE's traditional flag
  bool partial_rotary;       // mlx-lm ropes partial_rotary_factor * head_dim (any n_rot moves);
                             // false: it ropes the whole head, so n_rot must be the head dim
  KMap map;                  // what follows from the four above
  const char* proven;        // "" or the test that moves real sessions of it both ways
};

// Every row, in table order (for docs and tests).
std::span<const CrossEngineArch> cross_engine_archs();

// The row of `arch`, or nullptr.
const CrossEngineArch* find_cross_engine_arch(const std::string& arch);

// The row of the model's arch after checking it against the model's GGUF: kNotSupported (naming
// `who` and the arch) when the arch is not in the table, when the GGUF's rope kind is not the
// row's, or when it ropes fewer dims than a whole-head row's mlx-lm module does.
Result<const CrossEngineArch*> cross_engine_arch_for(const ModelProfile& p, const std::string& who);

}  // namespace kvsnap
