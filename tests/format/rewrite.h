// Parse then write a llama.cpp state held in memory: the byte-exact round trip the format tests
// check (a failing parse or write fails the calling test and gives back no bytes).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/llama_state.h"

namespace kvsnap::test {

inline std::vector<std::byte> rewrite(const std::vector<std::byte>& b, const ParseOptions& o = {},
                                      const std::string& name = "test.bin") {
  MemoryFile f(name, std::span<const std::byte>(b));
  auto st = parse_state(f, o);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (!st.ok()) return {};
  VectorSink out;
  CopyTensorSource src(f);
  Status s = write_state(*st, src, f, out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out.bytes;
}

}  // namespace kvsnap::test
