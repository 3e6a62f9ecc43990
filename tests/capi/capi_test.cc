// The C API (src/capi/kvsnap.h) through libkvsnap.so: conversions equal the
// command's bytes, bad input is an error with a message, never a crash.
#include "kvsnap.h"

#include <gtest/gtest.h>

#include <cstddef>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_files.h"

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

Converted convert_v2(const kvsnap_model* m, const std::vector<unsigned char>& in, const kvsnap_convert_params_v2* p) {
  void* out = nullptr;
  size_t n = 0;
  char* err = nullptr;
  Converted c;
  c.status = kvsnap_convert_state_v2(m, in.data(), in.size(), p, &out, &n, &err);
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

// Version 2 of the parameters reaches what only the command line could set: --requant, and the
// build of a raw buffer's llama.cpp (b8121's untagged buffers: kept untagged, its rule for the
// rotation), each equal to the command's bytes.
TEST(CApi, V2ParamsRequantAndSourceBuildEqualTheCommand) {
  Model m(fixture("models/tiny-hd64.gguf"));
  const std::string model_arg = " --model " + fixture("models/tiny-hd64.gguf");
  const auto dir = std::filesystem::temp_directory_path();
  const std::string pid = std::to_string(::getpid());

  // q5_0 -> q4_0: the default (auto: the quick search) and reference differ; each is the command's.
  kvsnap_convert_params_v2 p;
  kvsnap_convert_params_v2_init(&p, sizeof p);
  EXPECT_EQ(p.struct_size, sizeof p);
  EXPECT_EQ(p.flash_attn, -1);
  p.ctk = p.ctv = "q5_0";
  Converted q5 = convert_v2(m.m, slurp(fixture("v0.5.0/hd64-f16-f16-faon.slot")), &p);
  ASSERT_EQ(q5.status, KVSNAP_OK) << q5.error;
  const std::string q5_path = (dir / ("capi-q5-" + pid + ".slot")).string();
  std::ofstream(q5_path, std::ios::binary).write(reinterpret_cast<const char*>(q5.bytes.data()), std::streamsize(q5.bytes.size()));
  p.ctk = p.ctv = "q4_0";
  Converted automatic = convert_v2(m.m, q5.bytes, &p);
  p.requant = "reference";
  Converted reference = convert_v2(m.m, q5.bytes, &p);
  ASSERT_EQ(automatic.status, KVSNAP_OK) << automatic.error;
  ASSERT_EQ(reference.status, KVSNAP_OK) << reference.error;
  EXPECT_NE(automatic.bytes, reference.bytes) << "requant was not read";
  EXPECT_EQ(automatic.bytes, cli_convert(q5_path, "--ctk q4_0 --ctv q4_0" + model_arg));
  EXPECT_EQ(reference.bytes, cli_convert(q5_path, "--ctk q4_0 --ctv q4_0 --requant reference" + model_arg));
  std::filesystem::remove(q5_path);
  p.requant = "nearest";
  Converted bad = convert_v2(m.m, q5.bytes, &p);
  EXPECT_EQ(bad.status, KVSNAP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(bad.error.find("nearest"), std::string::npos) << bad.error;
  EXPECT_NE(bad.error.find("kvsnap_convert_params_v2.requant"), std::string::npos) << bad.error;

  // b8121's raw buffer (its slot file's memory section) -> q8_0: ambiguous rotation without the
  // build; with it, an untagged buffer equal to the command's.
  const auto slot = slurp(fixture("b8121/hd64-f16-f16-faon.slot"));
  uint32_t n_tokens = 0;
  std::memcpy(&n_tokens, slot.data() + 8, 4);
  const std::vector<unsigned char> raw(slot.begin() + 12 + 4 * std::ptrdiff_t(n_tokens), slot.end());
  const std::string raw_path = (dir / ("capi-b8121-" + pid + ".raw")).string();
  std::ofstream(raw_path, std::ios::binary).write(reinterpret_cast<const char*>(raw.data()), std::streamsize(raw.size()));
  kvsnap_convert_params_v2_init(&p, sizeof p);
  p.ctk = p.ctv = "q8_0";
  p.input = KVSNAP_INPUT_SEQ_BUFFER;
  Converted unknown = convert_v2(m.m, raw, &p);
  EXPECT_EQ(unknown.status, KVSNAP_ERR_AMBIGUOUS);
  EXPECT_NE(unknown.error.find("kvsnap_convert_params_v2.source_build"), std::string::npos) << unknown.error;
  EXPECT_EQ(unknown.error.find("--source-build"), std::string::npos) << unknown.error;
  p.source_build = "b8121";
  Converted known = convert_v2(m.m, raw, &p);
  ASSERT_EQ(known.status, KVSNAP_OK) << known.error;
  EXPECT_EQ(known.bytes, cli_convert(raw_path, "--input-format raw-seq --ctk q8_0 --ctv q8_0 --source-build b8121" + model_arg));
  ASSERT_GE(known.bytes.size(), 4u);
  EXPECT_NE(std::memcmp(known.bytes.data(), "\xd8\x3c\x14\xaf", 4), 0) << "tagged: b8121 would refuse it";
  std::filesystem::remove(raw_path);
}

// Old-format file bytes (b8121's slot) upgraded to the v0.5.0 format: v0.5.0 files of an M-RoPE
// model hold a cell extra the old file lacks, and only the model says whether it is one. Without
// a model the C API has nobody to tell an assumption to: it refuses (the command notes it).
TEST(CApi, AnUpgradeWithoutTheModelIsRefused) {
  const auto slot = slurp(fixture("b8121/hd64-f16-f16-faon.slot"));
  kvsnap_convert_params_v2 p;
  kvsnap_convert_params_v2_init(&p, sizeof p);
  Converted refused = convert_v2(nullptr, slot, &p);
  EXPECT_EQ(refused.status, KVSNAP_ERR_AMBIGUOUS);
  EXPECT_TRUE(refused.bytes.empty());
  EXPECT_NE(refused.error.find("needs the model"), std::string::npos) << refused.error;
  EXPECT_NE(refused.error.find("kvsnap_model_open"), std::string::npos) << refused.error;
  EXPECT_NE(refused.error.find("format = \"ggsq-v2\""), std::string::npos) << refused.error;
  // With the model: the command's bytes.
  Model m(fixture("models/tiny-hd64.gguf"));
  Converted upgraded = convert_v2(m.m, slot, &p);
  ASSERT_EQ(upgraded.status, KVSNAP_OK) << upgraded.error;
  EXPECT_EQ(upgraded.bytes,
            cli_convert(fixture("b8121/hd64-f16-f16-faon.slot"), "--model " + fixture("models/tiny-hd64.gguf")));
  // Keeping the old format needs no model.
  p.format = "ggsq-v2";
  Converted kept = convert_v2(nullptr, slot, &p);
  ASSERT_EQ(kept.status, KVSNAP_OK) << kept.error;
  EXPECT_EQ(kept.bytes, cli_convert(fixture("b8121/hd64-f16-f16-faon.slot"), "--format ggsq-v2"));
}

// struct_size: a program built against an older kvsnap.h (smaller) is refused only below the first
// version 2; one built against a newer kvsnap.h works while its extra members are unset.
TEST(CApi, V2StructSizeIsChecked) {
  const auto slot = slurp(fixture("v0.5.0/hd64-q8_0-q8_0-faon.slot"));
  struct Newer {
    kvsnap_convert_params_v2 known;
    const char* later;
  } newer;
  kvsnap_convert_params_v2_init(&newer.known, sizeof newer);
  EXPECT_EQ(newer.known.struct_size, sizeof newer);
  EXPECT_EQ(newer.later, nullptr);
  Converted same = convert_v2(nullptr, slot, &newer.known);
  ASSERT_EQ(same.status, KVSNAP_OK) << same.error;
  EXPECT_EQ(same.bytes, slot);
  newer.later = "set";
  Converted refused = convert_v2(nullptr, slot, &newer.known);
  EXPECT_EQ(refused.status, KVSNAP_ERR_NOT_SUPPORTED);
  EXPECT_NE(refused.error.find("newer kvsnap.h"), std::string::npos) << refused.error;

  kvsnap_convert_params_v2 p;
  kvsnap_convert_params_v2_init(&p, sizeof p);
  p.struct_size = size_t(1) << 40;  // never initialised: refused, not read
  Converted garbage = convert_v2(nullptr, slot, &p);
  EXPECT_EQ(garbage.status, KVSNAP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(garbage.error.find("not initialised"), std::string::npos) << garbage.error;
  p.struct_size = sizeof(size_t);
  Converted small = convert_v2(nullptr, slot, &p);
  EXPECT_EQ(small.status, KVSNAP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(small.error.find("kvsnap_convert_params_v2_init"), std::string::npos) << small.error;
  Converted defaults = convert_v2(nullptr, slot, nullptr);
  ASSERT_EQ(defaults.status, KVSNAP_OK) << defaults.error;
  EXPECT_EQ(defaults.bytes, slot);
  // A program built against the first kvsnap_convert_params_v2 (no kv_streams): taken, kv_streams
  // left at its default whatever the bytes past its struct hold.
  struct First {
    kvsnap_convert_params_v2 p;
    int after;
  } first;
  kvsnap_convert_params_v2_init(&first.p, sizeof first.p);
  first.p.struct_size = offsetof(kvsnap_convert_params_v2, kv_streams);
  first.p.kv_streams = 7;  // not the caller's: past its struct
  Converted old_size = convert_v2(nullptr, slot, &first.p);
  ASSERT_EQ(old_size.status, KVSNAP_OK) << old_size.error;
  EXPECT_EQ(old_size.bytes, slot);
  first.p.struct_size = offsetof(kvsnap_convert_params_v2, kv_streams) - 1;
  EXPECT_EQ(convert_v2(nullptr, slot, &first.p).status, KVSNAP_ERR_INVALID_ARGUMENT);
  // A newer kvsnap.h's next member may sit in this struct's tail padding: set, it is refused, not
  // copied into the padding and ignored (a review's finding).
  const size_t known_end = offsetof(kvsnap_convert_params_v2, kv_streams) + sizeof(int);
  if (sizeof(kvsnap_convert_params_v2) > known_end) {
    kvsnap_convert_params_v2 padded;
    kvsnap_convert_params_v2_init(&padded, sizeof padded);
    reinterpret_cast<unsigned char*>(&padded)[known_end] = 7;
    Converted in_padding = convert_v2(nullptr, slot, &padded);
    EXPECT_EQ(in_padding.status, KVSNAP_ERR_NOT_SUPPORTED) << in_padding.error;
  }
}

// kv_streams: a sequence for a context of another stream count, as `kvsnap convert --kv-streams`
// writes it; a raw sequence buffer too (a live move between contexts of other n_seq_max / kv_unified).
TEST(CApi, KvStreamsAsTheCommandLineWritesThem) {
  const auto slot = slurp(fixture("v0.5.0/hd64-f16-f16-faon.slot"));
  kvsnap_convert_params_v2 p;
  kvsnap_convert_params_v2_init(&p, sizeof p);
  p.kv_streams = 3;
  Converted three = convert_v2(nullptr, slot, &p);
  ASSERT_EQ(three.status, KVSNAP_OK) << three.error;
  EXPECT_EQ(three.bytes, cli_convert(fixture("v0.5.0/hd64-f16-f16-faon.slot"), "--kv-streams 3"));
  const auto raw = slurp(fixture("v0.5.0/hd64-f16-f16-faon.raw"));
  p.input = KVSNAP_INPUT_SEQ_BUFFER;
  Converted raw3 = convert_v2(nullptr, raw, &p);
  ASSERT_EQ(raw3.status, KVSNAP_OK) << raw3.error;
  EXPECT_EQ(raw3.bytes.size(), raw.size() + 8) << "two empty streams";
  p.kv_streams = 1;
  Converted back = convert_v2(nullptr, raw3.bytes, &p);
  ASSERT_EQ(back.status, KVSNAP_OK) << back.error;
  EXPECT_EQ(back.bytes, raw);
  p.kv_streams = 300;
  EXPECT_EQ(convert_v2(nullptr, raw, &p).status, KVSNAP_ERR_INVALID_ARGUMENT);
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

// Review findings: a thread count no machine has started that many threads (and failed as an I/O
// error); an enum value this library does not know was read as a file; a NULL argument left the
// caller's out-parameters as they were; a remedy's pattern was printed as a C string to set.
TEST(CApi, ArgumentsOutOfRangeAreRefusedAndOutParametersCleared) {
  Model m(fixture("models/tiny-hd64.gguf"));
  auto raw = slurp(fixture("v0.5.0/hd64-f16-f16-faon.raw"));
  kvsnap_convert_params p;
  kvsnap_convert_params_init(&p);
  p.n_threads = 1 << 30;
  Converted many = convert(m.m, raw, p);
  EXPECT_EQ(many.status, KVSNAP_ERR_INVALID_ARGUMENT) << many.error;
  EXPECT_NE(many.error.find("kvsnap_convert_params.n_threads"), std::string::npos) << many.error;
  p.n_threads = -1;
  EXPECT_EQ(convert(m.m, raw, p).status, KVSNAP_ERR_INVALID_ARGUMENT);
  p.n_threads = 256;
  EXPECT_EQ(convert(m.m, raw, p).status, KVSNAP_OK);
  p.n_threads = 0;

  p.input = static_cast<kvsnap_input_kind>(7);
  Converted kind = convert(m.m, raw, p);
  EXPECT_EQ(kind.status, KVSNAP_ERR_NOT_SUPPORTED) << kind.error;
  p.input = KVSNAP_INPUT_AUTO;
  p.flash_attn = 2;
  EXPECT_EQ(convert(m.m, raw, p).status, KVSNAP_ERR_INVALID_ARGUMENT);
  p.flash_attn = -1;

  kvsnap_model* model = reinterpret_cast<kvsnap_model*>(1);
  EXPECT_EQ(kvsnap_model_open(nullptr, &model, nullptr), KVSNAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(model, nullptr);
  void* out = &model;
  size_t n = 5;
  EXPECT_EQ(kvsnap_convert_state(m.m, nullptr, 10, &p, &out, &n, nullptr), KVSNAP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(n, 0u);

  p.ctk = "f16";
  p.ctv = "f16";
  auto unwitnessed = slurp(fixture("b10361/hd64-q8_0-q8_0-faon.slot"));
  ASSERT_TRUE(kvsnap::test::drop_repeated_tokens(unwitnessed));  // no token twice: layer 0's RoPE tells nothing
  Converted ambiguous = convert(m.m, unwitnessed, p);
  EXPECT_EQ(ambiguous.status, KVSNAP_ERR_AMBIGUOUS);
  EXPECT_NE(ambiguous.error.find("kvsnap_convert_params_v2.src_rotation (\"on\" or \"off\")"), std::string::npos)
      << ambiguous.error;
  EXPECT_EQ(ambiguous.error.find('|'), std::string::npos) << ambiguous.error;
}

}  // namespace
