// writes_input_unchanged (migrate/convert_state.h) on every file of the fixture zoo that llama.cpp
// wrote, with requests that keep it and requests that change it: it says true exactly where
// convert_state writes the input's own bytes. The store copies a snapshot's stored bytes instead of
// converting where it says true, so a true that is wrong would restore other bytes than a
// conversion: the test compares with convert_state's output, never with the check's own reading.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/json.h"
#include "migrate/conversion_spec.h"
#include "migrate/convert_state.h"
#include "migrate/model_info.h"

namespace kvsnap {
namespace {

std::string fixture(const std::string& name) { return std::string(KVSNAP_SOURCE_DIR) + "/fixtures/" + name; }

struct Named {
  std::string what;
  ConvertRequest req;
};

// Requests for `st`: what it is (nothing named; its own types and V layout named, as restore
// --server names a server's), and what it is not (another K type, a rotation forced on,
// two KV streams, an older format).
std::vector<Named> requests_for(const StateFile& st) {
  std::vector<Named> out;
  out.push_back({"nothing named", {}});
  const KvLayer* first = nullptr;
  bool v_trans = false;
  for (const KvSection& sec : st.memory.kv)
    for (const KvStream& s : sec.streams)
      if (!first && s.cell_count > 0 && !s.layers.empty()) first = &s.layers[0], v_trans = s.v_trans != 0;
  if (first) {
    ConvertRequest own;
    own.k_type = first->k_type;
    own.v_type = first->v_type;
    own.flash_attn = !v_trans;
    out.push_back({"its own types named", own});
    ConvertRequest other = own;
    other.k_type = first->k_type == int32_t(GgmlType::kQ8_0) ? int32_t(GgmlType::kF16) : int32_t(GgmlType::kQ8_0);
    other.flash_attn = true;
    out.push_back({"another K type", other});
    ConvertRequest rotated = own;
    rotated.k_rotation.src = RotationMode::kOff;
    rotated.k_rotation.dst = RotationMode::kOn;
    out.push_back({"K rotated on the way", rotated});
  }
  ConvertRequest streams;
  streams.kv_streams = 2;
  out.push_back({"two KV streams", streams});
  ConvertRequest older;
  older.format = st.kind == StateKind::kSessionFile ? TargetFormat::kGgsnV9 : TargetFormat::kGgsqV2;
  out.push_back({"an older format", older});
  return out;
}

TEST(WritesInputUnchanged, SaysTrueExactlyWhereConvertWritesTheInput) {
  int files = 0, unchanged = 0, changed = 0;
  for (const std::string tag : {"b3166", "b3543", "b5640", "b8121", "b8179", "b8390", "b9842", "b10361", "v0.4.0",
                                "v0.5.0"}) {
    std::ifstream manifest_in(fixture(tag + "/MANIFEST.json"));
    ASSERT_TRUE(manifest_in) << tag;
    const auto manifest = nlohmann::json::parse(manifest_in);
    for (const auto& entry : manifest.at("files")) {
      const std::string file = entry.at("file");
      if (!file.ends_with(".slot") && !file.ends_with(".session")) continue;
      const std::string model_path = entry.at("model");
      if (!std::ifstream(fixture(model_path))) continue;  // a large model regen.sh recreates
      SCOPED_TRACE(tag + "/" + file);
      auto model = load_model_info(posix_io(), fixture(model_path));
      ASSERT_TRUE(model.ok()) << model.status().ToString();
      auto in = posix_io().open_read(fixture(tag + "/" + file));
      ASSERT_TRUE(in.ok()) << in.status().ToString();
      auto st = parse_for_model(**in, {}, &*model);
      if (!st.ok()) continue;  // files kept as refused inputs
      std::vector<std::byte> bytes((*in)->size());
      ASSERT_TRUE((*in)->read_at(0, bytes).ok());
      ++files;
      for (Named& n : requests_for(*st)) {
        SCOPED_TRACE(n.what);
        n.req.geometry = model_rotation_geometry(*model);
        auto said = writes_input_unchanged(*st, **in, n.req);
        ASSERT_TRUE(said.ok()) << said.status().ToString();
        VectorSink out;
        auto converted = convert_state(*st, **in, n.req, out);
        if (!converted.ok()) {
          EXPECT_FALSE(*said) << "convert_state refuses: " << converted.status().ToString();
          continue;
        }
        EXPECT_EQ(*said, out.bytes == bytes) << "output " << out.bytes.size() << " bytes, input " << bytes.size();
        (*said ? unchanged : changed)++;
      }
    }
  }
  // Both answers were given, on many files: a check that always says false (or true) fails here.
  EXPECT_GE(files, 100);
  EXPECT_GE(unchanged, 100);
  EXPECT_GE(changed, 100);
  std::printf("%d files: %d conversions writing the input unchanged, %d changing it\n", files, unchanged, changed);
}

// The check reads only what is not a tensor: a file whose tensor bytes cannot be read (a store's
// damaged chunk) is still found unchanged; its copy then fails on those bytes, as a conversion would.
TEST(WritesInputUnchanged, ReadsHeadersAndCellsButNotTheTensors) {
  auto model = load_model_info(posix_io(), fixture("models/tiny-hd128.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto in = posix_io().open_read(fixture("v0.5.0/hd128-f16-f16-faon.slot"));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  auto st = parse_for_model(**in, {}, &*model);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  // A file that fails any read inside a tensor.
  struct TensorsUnreadable final : ReadableFile {
    const ReadableFile& f;
    std::vector<ByteRange> tensors;
    explicit TensorsUnreadable(const ReadableFile& x) : f(x) {}
    uint64_t size() const override { return f.size(); }
    const std::string& name() const override { return f.name(); }
    Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
      for (const ByteRange& r : tensors)
        if (offset < r.offset + r.size && r.offset < offset + dst.size()) return Status::Corruption("a tensor was read");
      return f.read_at(offset, dst);
    }
  } unreadable(**in);
  for (const KvSection& sec : st->memory.kv)
    for (const KvStream& s : sec.streams)
      for (const KvLayer& L : s.layers) {
        unreadable.tensors.push_back(L.k);
        if (L.has_v) unreadable.tensors.push_back(L.v);
      }
  ASSERT_GE(unreadable.tensors.size(), 8u);
  ConvertRequest own;
  own.k_type = int32_t(GgmlType::kF16);
  own.v_type = int32_t(GgmlType::kF16);
  own.flash_attn = true;
  auto said = writes_input_unchanged(*st, unreadable, own);
  ASSERT_TRUE(said.ok()) << said.status().ToString();
  EXPECT_TRUE(*said);
  VectorSink out;
  EXPECT_EQ(convert_state(*st, unreadable, own, out).status().code(), Code::kCorruption);
}

}  // namespace
}  // namespace kvsnap
