#include "cli/era_options.h"

namespace kvsnap::cli {

void add_source_options(CLI::App* sub, std::string& src_rotation, std::string& source_build, const std::string& what) {
  sub->add_option("--src-rotation", src_rotation,
                  "auto|on|off: whether the llama.cpp that wrote " + what +
                      " stored quantized K/V rotated (off: LLAMA_ATTN_ROT_DISABLE=1 or a build before b8643; "
                      "on: refused for a layout only builds before the rotation write; "
                      "auto: decided from the evidence, refused when nothing decides)")
      ->check(CLI::IsMember({"", "auto", "on", "off"}));
  sub->add_option("--source-build", source_build,
                  "the llama.cpp build that wrote " + what +
                      " (b8121, v0.5.0; llama-server --version shows it): decides whether quantized caches are "
                      "stored rotated, and is checked against each file");
}

void add_target_build_option(CLI::App* sub, std::string& target_build, const std::string& what) {
  sub->add_option("--target-build", target_build,
                  "the llama.cpp build that will load " + what +
                      ": picks the file format, n_stream prefix, session outputs, M-RoPE cell extra and whether "
                      "quantized caches are written rotated");
}

}  // namespace kvsnap::cli
