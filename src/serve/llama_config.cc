#include "serve/llama_config.h"

#include <cstdint>

namespace kvsnap {

namespace {

// The UTF-8 character at `pos` as llama.cpp's common_parse_utf8_codepoint decodes it (a lead byte and
// as many continuation bytes as it announces; overlong forms and surrogates pass): its code point
// and length, or length 0 where it reports one invalid or cut short.
struct Char {
  uint32_t cp = 0;
  size_t len = 0;
};
Char decode(std::string_view s, size_t pos) {
  if (pos >= s.size()) return {};
  const auto b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) return {b, 1};
  size_t n = 0;
  uint32_t cp = 0;
  if ((b & 0xe0) == 0xc0) n = 2, cp = b & 0x1f;
  else if ((b & 0xf0) == 0xe0) n = 3, cp = b & 0x0f;
  else if ((b & 0xf8) == 0xf0) n = 4, cp = b & 0x07;
  else return {};  // a continuation byte first, or 0xf8..0xff
  if (pos + n > s.size()) return {};
  for (size_t i = 1; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[pos + i]);
    if ((c & 0xc0) != 0x80) return {};
    cp = cp << 6 | (c & 0x3f);
  }
  return {cp, n};
}

// The grammar's character classes ([ \t], [;#], the key's) hold for decoded characters, so an
// overlong form counts (C0 A0 is a blank); its literals ("[", "]", "=", the newlines) are bytes.
bool is_blank(uint32_t c) { return c == ' ' || c == '\t'; }
bool starts_comment(uint32_t c) { return c == ';' || c == '#'; }
bool ident_first(uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool ident_rest(uint32_t c) { return ident_first(c) || (c >= '0' && c <= '9') || c == '.' || c == '-'; }
bool is_newline(char c) { return c == '\n' || c == '\r'; }

class IniReader {
 public:
  explicit IniReader(std::string_view s) : s_(s) {}

  Result<LlamaConfigIni> read() {
    std::string section = "default";
    std::map<std::string, std::map<std::string, std::string>> sections;
    while (pos_ < s_.size()) {
      const size_t line_start = pos_;
      const Char c = decode(s_, pos_);
      if (s_[pos_] == '[') {
        // header-line ::= "[" ws [^]]+ ws "]" eol (the name takes any trailing white space)
        ++pos_;
        skip_blanks();
        const size_t name_start = pos_;
        for (Char n; (n = decode(s_, pos_)).len != 0 && n.cp != ']';) pos_ += n.len;
        if (pos_ == name_start) return error(line_start, "an empty section name, or one that is not UTF-8");
        const std::string name(s_.substr(name_start, pos_ - name_start));
        skip_blanks();
        if (pos_ == s_.size() || s_[pos_] != ']')
          return error(line_start, "a section name not ended by ']' (bytes that are not UTF-8, or an overlong ']')");
        ++pos_;
        if (!end_of_line()) return error(line_start, "text after a section's ']'");
        section = name;
        sections[section].clear();
      } else if (c.len != 0 && ident_first(c.cp)) {
        // kv-line ::= ident ws "=" ws value eol
        const size_t key_start = pos_;
        for (Char k = c; k.len != 0 && ident_rest(k.cp); k = decode(s_, pos_)) pos_ += k.len;
        const std::string key(s_.substr(key_start, pos_ - key_start));
        skip_blanks();
        if (pos_ == s_.size() || s_[pos_] != '=')
          return error(line_start, "a key without '=' (or a key with a character outside [a-zA-Z0-9_.-])");
        ++pos_;
        skip_blanks();
        const size_t value_start = pos_;
        const size_t value_end = value_stop();
        sections[section][key].assign(s_.substr(value_start, value_end - value_start));
        pos_ = value_end;
        if (!end_of_line()) return error(line_start, "a value that is not UTF-8");
      } else if ((c.len != 0 && (is_blank(c.cp) || starts_comment(c.cp))) || is_newline(s_[pos_])) {
        // comment-line ::= ws comment (newline / EOF); blank-line ::= ws (newline / EOF)
        skip_blanks();
        const Char n = decode(s_, pos_);
        if (pos_ < s_.size() && !(n.len != 0 && starts_comment(n.cp)) && !is_newline(s_[pos_]))
          return error(line_start, "white space before a key or section (llama.cpp allows none)");
        if (!end_of_line()) return error(line_start, "a comment that is not UTF-8");
      } else {
        if (s_.substr(pos_, 3) == "\xef\xbb\xbf") return error(line_start, "a byte-order mark (llama.cpp reads none)");
        return error(line_start, c.len == 0 ? "text that is not UTF-8" : "a line that is no key, section or comment");
      }
    }
    LlamaConfigIni ini;
    if (auto it = sections.find("*"); it != sections.end()) ini.global = std::move(it->second);
    if (auto it = sections.find("default"); it != sections.end()) ini.defaults = std::move(it->second);
    return ini;
  }

 private:
  // ws ::= [ \t]*, from `p`: where it ends.
  size_t blanks_end(size_t p) const {
    for (Char c; (c = decode(s_, p)).len != 0 && is_blank(c.cp);) p += c.len;
    return p;
  }
  void skip_blanks() { pos_ = blanks_end(pos_); }
  bool comment_at(size_t p) const {
    const Char c = decode(s_, p);
    return c.len != 0 && starts_comment(c.cp);
  }

  // eol ::= ws comment? (newline / EOF), comment ::= [;#] (!newline any)*
  bool end_of_line() {
    skip_blanks();
    if (comment_at(pos_)) {
      pos_ += decode(s_, pos_).len;
      while (pos_ < s_.size() && !is_newline(s_[pos_])) {
        const Char c = decode(s_, pos_);
        if (c.len == 0) return false;
        pos_ += c.len;
      }
    }
    if (pos_ == s_.size()) return true;
    if (s_[pos_] == '\r') {
      ++pos_;
      if (pos_ < s_.size() && s_[pos_] == '\n') ++pos_;
      return true;
    }
    if (s_[pos_] == '\n') {
      ++pos_;
      return true;
    }
    return false;
  }

  // value ::= (!(ws ([;#] / newline / EOF)) any)*: where the value starting at pos_ ends. A run of
  // blanks is looked past once (not again from each of its characters), so this is linear.
  size_t value_stop() const {
    size_t p = pos_;
    while (p < s_.size()) {
      const size_t q = blanks_end(p);
      if (q == s_.size() || comment_at(q) || is_newline(s_[q])) return p;
      if (q > p) {
        p = q;  // blanks inside the value
        continue;
      }
      const Char c = decode(s_, p);
      if (c.len == 0) return p;  // end_of_line() then fails there
      p += c.len;
    }
    return p;
  }

  Status error(size_t line_start, const std::string& what) const {
    size_t line = 1;
    for (size_t i = 0; i < line_start; ++i)
      if (s_[i] == '\n' || (s_[i] == '\r' && (i + 1 == s_.size() || s_[i + 1] != '\n'))) ++line;
    return Status::InvalidArgument("line " + std::to_string(line) + ": " + what +
                                   "; llama-server refuses to start with it (\"failed to parse server config file\")");
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

Result<LlamaConfigIni> parse_llama_config_ini(std::string_view text) { return IniReader(text).read(); }

}  // namespace kvsnap
