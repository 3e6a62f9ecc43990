// llama.cpp starts no context whose quantized cache type's block does not divide a layer's head dim,
// with flash attention (3.22.1 llama-context.cpp: "K cache type q8_0 with block size 32 does not
// divide n_embd_head_k=80"). A conversion to such a type is refused before anything is written: the
// file could never be restored (a review's finding: convert said success, each row being whole blocks).
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "base/io.h"
#include "format/state_builder.h"
#include "migrate/conversion_spec.h"
#include "migrate/model_info.h"
#include "support/gguf_writer.h"

namespace kvsnap {
namespace {

// A llama of 2 layers, 2 heads of `head_dim` (n_embd = 2 x head_dim).
std::string model_of_head_dim(uint32_t head_dim) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.context_length", 4096);
  w.set_u32("llama.embedding_length", 2 * head_dim);
  w.set_u32("llama.block_count", 2);
  w.set_u32("llama.attention.head_count", 2);
  w.set_u32("llama.attention.head_count_kv", 2);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvsnap-hd" + std::to_string(head_dim) + "-" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  EXPECT_TRUE(w.write_file(posix_io(), path).ok());
  return path;
}

TEST(HeadDimBlocks, AQuantizedTypeWhoseBlockDoesNotDivideTheHeadDimIsRefusedWithFlashAttention) {
  const std::string path = model_of_head_dim(80);
  auto model = load_model_info(posix_io(), path);
  std::filesystem::remove(path);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  testing::SynthSpec s;
  s.layers = {{1, 160, 1, 160}, {1, 160, 1, 160}};  // f16 rows of 2 heads x 80
  const auto bytes = testing::build_state(s);
  MemoryFile file("hd80.slot", std::span<const std::byte>(bytes));
  auto st = parse_state(file, {});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ConversionSpec spec;
  spec.ctk = "q8_0";
  auto refused = make_request(spec, *st, &*model, file.name());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kNotSupported) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("K cache type q8_0 with block size 32 does not divide layer 0's head dim 80"),
            std::string::npos)
      << refused.status().ToString();
  // f16 and bf16 have blocks of one value; V as columns (flash attention off) has no such rule.
  spec.ctk = "bf16";
  EXPECT_TRUE(make_request(spec, *st, &*model, file.name()).ok());
  spec.ctk = "q8_0";
  spec.flash_attn = "off";
  EXPECT_TRUE(make_request(spec, *st, &*model, file.name()).ok());
}

}  // namespace
}  // namespace kvsnap
