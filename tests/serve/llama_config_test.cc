// serve/llama_config.h: llama-server's config.ini grammar. The cases are the ones
// tests/oracle/serve_config_test.py runs through llama-server 3.22.1 itself (the same table,
// tests/serve/llama_config_cases.json): here they pin kvsnap's reading without a server.
#include "base/json.h"
#include "serve/llama_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace kvsnap {
namespace {

std::string cases_path() { return std::string(KVSNAP_SOURCE_DIR) + "/tests/serve/llama_config_cases.json"; }

// The table's strings hold one byte per character (U+0000..U+00FF), so that it can hold bytes that
// are not UTF-8: JSON's UTF-8 back to those bytes.
std::string bytes_of(const std::string& utf8) {
  std::string out;
  for (size_t i = 0; i < utf8.size(); ++i) {
    const auto b = static_cast<unsigned char>(utf8[i]);
    if (b < 0x80) {
      out += char(b);
    } else {
      out += char(((b & 0x03) << 6) | (static_cast<unsigned char>(utf8[i + 1]) & 0x3f));  // C2/C3 xx
      ++i;
    }
  }
  return out;
}

// Every case of the shared table: the text, and what llama-server does with it: refuses the file,
// applies no flash-attn setting ("none"), or applies VALUE first ("fa=VALUE"; the table's values
// are words llama-server rejects, so the first one applied is the one its error names: the "[*]"
// section's, else the default section's, each the last of its spellings in key order).
TEST(LlamaConfigIni, EveryCaseOfTheOracleTable) {
  std::ifstream f(cases_path());
  ASSERT_TRUE(f) << cases_path();
  const nlohmann::json doc = nlohmann::json::parse(f);
  ASSERT_GE(doc.at("cases").size(), 70u);
  for (const auto& c : doc.at("cases")) {
    const std::string text = bytes_of(c.at("text").get<std::string>());
    const std::string expect = bytes_of(c.at("expect").get<std::string>());
    SCOPED_TRACE("case: " + c.at("text").dump());
    auto ini = parse_llama_config_ini(text);
    if (expect == "refused") {
      ASSERT_FALSE(ini.ok());
      EXPECT_EQ(ini.status().message().rfind("line ", 0), 0u) << ini.status().message();
      continue;
    }
    ASSERT_TRUE(ini.ok()) << ini.status().ToString();
    std::string seen = "none";
    for (const auto* section : {&ini->defaults, &ini->global}) {  // the global one is applied first
      for (const char* key : {"LLAMA_ARG_FLASH_ATTN", "fa", "flash-attn"})
        if (auto it = section->find(key); it != section->end()) seen = "fa=" + it->second;
    }
    EXPECT_EQ(seen, expect);
  }
}

TEST(LlamaConfigIni, RefusalsNameTheLine) {
  auto ini = parse_llama_config_ini("[*]\r\nctx-size = 1\r\n\n  fa = on\n");
  ASSERT_FALSE(ini.ok());
  EXPECT_NE(ini.status().message().find("line 4: white space before a key"), std::string::npos)
      << ini.status().message();
  ini = parse_llama_config_ini("a = 1\rb = 2\r[]\n");
  ASSERT_FALSE(ini.ok());
  EXPECT_NE(ini.status().message().find("line 3: an empty section name"), std::string::npos) << ini.status().message();
}

// The sections a file keeps: "[*]" and the default one, each key once (the last line's value).
TEST(LlamaConfigIni, SectionsAndRepeatedKeys) {
  auto ini = parse_llama_config_ini(
      "ctk = q4_0\nctk = q8_0 ; the later line\n[*]\nc = 4096\n[model-a]\nctv = q4_0\n[default]\nctv = f16\n");
  ASSERT_TRUE(ini.ok()) << ini.status().ToString();
  EXPECT_EQ(ini->global, (std::map<std::string, std::string>{{"c", "4096"}}));
  // "[default]" starts the default section afresh: the ctk lines before it are gone.
  EXPECT_EQ(ini->defaults, (std::map<std::string, std::string>{{"ctv", "f16"}}));
}

// A value a run of white space long is read in linear time (a quadratic scan would take minutes).
TEST(LlamaConfigIni, LongBlankRunsAreLinear) {
  std::string text = "fa = a" + std::string(4 << 20, ' ') + "b" + std::string(4 << 20, '\t') + "\n";
  auto ini = parse_llama_config_ini(text);
  ASSERT_TRUE(ini.ok());
  EXPECT_EQ(ini->defaults.at("fa").size(), 2 + (4u << 20));
}

}  // namespace
}  // namespace kvsnap
