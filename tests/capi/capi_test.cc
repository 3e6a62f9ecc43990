// The C API (src/capi/kvsnap.h) through libkvsnap.so: conversions equal the
// command's bytes, bad input is an error with a message, never a crash.
#include "kvsnap.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::string fixture(const std::string& name) { return std::string(KVSNAP_SOURCE_DIR) + "/fixtures/" + name; }

std::vector<unsigned char> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(in)), {});
}

struct Model {
  kvsnap_model* m = nullptr;
  explicit Model(const std::string& path) {
    char* err = nullptr;
    EXPECT_EQ(kvsnap_model_open(path.c_str(), &m, &err), KVSNAP_OK) << (err ? err : "");
    kvsnap_free(err);
  }
  ~Model() { kvsnap_model_free(m); }
};

struct Converted {
  kvsnap_status status;
  std::vector<unsigned char> bytes;
  std::string error;
};

Converted convert(const kvsnap_model* m, const std::vector<unsigned char>& in, const kvsnap_convert_params& p) {
  void* out = nullptr;
  size_t n = 0;
  char* err = nullptr;
  Converted c;
  c.status = kvsnap_convert_state(m, in.data(), in.size(), &p, &out, &n, &err);
  if (out) c.bytes.assign(static_cast<unsigned char*>(out), static_cast<unsigned char*>(out) + n);
  if (err) c.error = err;
  kvsnap_free(out);
  kvsnap_free(err);
  return c;
}

// What `kvsnap convert` writes for the same request.
std::vector<unsigned char> cli_convert(const std::string& in, const std::string& args) {
  const auto out = std::filesystem::temp_directory_path() / ("capi-" + std::to_string(::getpid()) + ".bin");
  std::string cmd = std::string(KVSNAP_BINARY) + " convert " + in + " " + out.string() + " " + args + " >/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto b = slurp(out.string());
  std::filesystem::remove(out);
  return b;
}

TEST(CApi, SequenceBufferToQ8EqualsTheCommand) {
  Model m(fixture("models/tiny-hd64.gguf"));
  auto raw = slurp(fixture("v0.5.0/hd64-f16-f16-faon.raw"));
  kvsnap_convert_params p;
  kvsnap_convert_params_init(&p);
  p.ctk = "q8_0";
  p.ctv = "q4_0";
  p.input = KVSNAP_INPUT_SEQ_BUFFER;
  Converted c = convert(m.m, raw, p);
  ASSERT_EQ(c.status, KVSNAP_OK) << c.error;
  EXPECT_EQ(c.bytes, cli_convert(fixture("v0.5.0/hd64-f16-f16-faon.raw"),
                                 "--input-format raw-seq --ctk q8_0 --ctv q4_0 --model " +
                                     fixture("models/tiny-hd64.gguf")));
  // and back to f16 restores the types (not the values: q8_0 is lossy)
  p.ctk = p.ctv = "f16";
  Converted back = convert(m.m, c.bytes, p);
  ASSERT_EQ(back.status, KVSNAP_OK) << back.error;
  EXPECT_EQ(back.bytes.size(), raw.size());
}

TEST(CApi, FileBytesAutoDetectedAndIdentityIsExact) {
  auto slot = slurp(fixture("v0.5.0/hd64-q8_0-q8_0-faon.slot"));
  kvsnap_convert_params p;
  kvsnap_convert_params_init(&p);
  Converted c = convert(nullptr, slot, p);
  ASSERT_EQ(c.status, KVSNAP_OK) << c.error;
  EXPECT_EQ(c.bytes, slot);
}

TEST(CApi, ErrorsAreStatusesWithMessages) {
  Model m(fixture("models/tiny-hd64.gguf"));
  auto raw = slurp(fixture("v0.5.0/hd64-f16-f16-faon.raw"));
  kvsnap_convert_params p;
  kvsnap_convert_params_init(&p);
  p.input = KVSNAP_INPUT_SEQ_BUFFER;
  p.ctk = "q9_9";
  Converted bad_type = convert(m.m, raw, p);
  EXPECT_EQ(bad_type.status, KVSNAP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(bad_type.error.find("q9_9"), std::string::npos) << bad_type.error;

  p.ctk = "q8_0";
  p.ctv = "q8_0";
  p.flash_attn = 0;  // quantized V needs flash attention
  Converted no_fa = convert(m.m, raw, p);
  EXPECT_EQ(no_fa.status, KVSNAP_ERR_INVALID_ARGUMENT);
  // the remedy in this API's words, never a command-line flag (base/remedy.h)
  EXPECT_NE(no_fa.error.find("kvsnap_convert_params.flash_attn = 1"), std::string::npos) << no_fa.error;
  EXPECT_EQ(no_fa.error.find("--flash-attn"), std::string::npos) << no_fa.error;
  EXPECT_EQ(no_fa.error.find('{'), std::string::npos) << no_fa.error;
  p.flash_attn = -1;

  Converted no_model = convert(nullptr, raw, p);  // f16 -> q8_0 rotates by head dims only the model knows
  EXPECT_NE(no_model.status, KVSNAP_OK);
  EXPECT_NE(no_model.error.find("kvsnap_model"), std::string::npos) << no_model.error;
  EXPECT_EQ(no_model.error.find("--model"), std::string::npos) << no_model.error;

  for (size_t cut : {size_t(0), size_t(3), size_t(100), raw.size() / 2, raw.size() - 1}) {
    std::vector<unsigned char> part(raw.begin(), raw.begin() + cut);
    Converted c = convert(m.m, part, p);
    EXPECT_NE(c.status, KVSNAP_OK) << "prefix " << cut;
    EXPECT_FALSE(c.error.empty());
    EXPECT_TRUE(c.bytes.empty());
  }

  Model other(fixture("models/tiny-iswa.gguf"));
  Converted wrong = convert(other.m, raw, p);
  EXPECT_NE(wrong.status, KVSNAP_OK);
  EXPECT_FALSE(wrong.error.empty());

  kvsnap_model* none = nullptr;
  char* err = nullptr;
  EXPECT_NE(kvsnap_model_open("/nonexistent.gguf", &none, &err), KVSNAP_OK);
  EXPECT_EQ(none, nullptr);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(std::string(err).find("/nonexistent.gguf"), std::string::npos) << err;
  kvsnap_free(err);
  EXPECT_NE(kvsnap_model_open("/nonexistent.gguf", &none, nullptr), KVSNAP_OK);  // error may be NULL

  void* out = nullptr;
  size_t n = 0;
  EXPECT_EQ(kvsnap_convert_state(m.m, nullptr, 10, &p, &out, &n, nullptr), KVSNAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvsnap_convert_state(m.m, raw.data(), raw.size(), &p, nullptr, &n, nullptr), KVSNAP_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(kvsnap_status_name(KVSNAP_ERR_CORRUPT), "corrupt");
  EXPECT_NE(std::string(kvsnap_version()), "");
}

}  // namespace
