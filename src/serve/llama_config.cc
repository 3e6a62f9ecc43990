#include "serve/llama_config.h"

namespace kvsnap {

namespace {

// The bytes of the UTF-8 character at `pos` as llama.cpp's common_parse_utf8_codepoint takes it
// (a lead byte and as many continuation bytes as it announces; overlong forms and surrogates
// pass), or 0 where it reports one invalid or cut short.
size_t utf8_length(std::string_view s, size_t pos) {
  const auto b = static_cast<unsigned char>(s[pos]);
  size_t n = 0;
  if (b < 0x80) return 1;
  if ((b & 0xe0) == 0xc0) n = 2;
  else if ((b & 0xf0) == 0xe0) n = 3;
  else if ((b & 0xf8) == 0xf0) n = 4;
  else return 0;  // a continuation byte first, or 0xf8..0xff
  if (pos + n > s.size()) return 0;
  for (size_t i = 1; i < n; ++i)
    if ((static_cast<unsigned char>(s[pos + i]) & 0xc0) != 0x80) return 0;
  return n;
}

bool is_blank(char c) { return c == ' ' || c == '\t'; }
bool is_newline(char c) { return c == '\n' || c == '\r'; }
bool starts_comment(char c) { return c == ';' || c == '#'; }
bool ident_first(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool ident_rest(char c) { return ident_first(c) || (c >= '0' && c <= '9') || c == '.' || c == '-'; }

class IniReader {
 public:
  explicit IniReader(std::string_view s) : s_(s) {}

  Result<LlamaConfigIni> read() {
    std::string section = "default";
    std::map<std::string, std::map<std::string, std::string>> sections;
    while (pos_ < s_.size()) {
      const size_t line_start = pos_;
      const char c = s_[pos_];
      if (c == '[') {
        // header-line ::= "[" ws [^]]+ ws "]" eol (the name takes any trailing white space)
        ++pos_;
        skip_blanks();
        const size_t name_start = pos_;
        while (pos_ < s_.size() && s_[pos_] != ']') {
          const size_t n = utf8_length(s_, pos_);
          if (n == 0) return error(line_start, "a section name that is not UTF-8");
          pos_ += n;
        }
        if (pos_ == name_start) return error(line_start, "an empty section name");
        if (pos_ == s_.size()) return error(line_start, "a '[' with no ']'");
        section.assign(s_.substr(name_start, pos_ - name_start));
        ++pos_;
        if (!end_of_line()) return error(line_start, "text after a section's ']'");
        sections[section].clear();
      } else if (ident_first(c)) {
        // kv-line ::= ident ws "=" ws value eol
        const size_t key_start = pos_;
        while (pos_ < s_.size() && ident_rest(s_[pos_])) ++pos_;
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
      } else if (is_blank(c) || starts_comment(c) || is_newline(c)) {
        // comment-line ::= ws comment (newline / EOF); blank-line ::= ws (newline / EOF)
        skip_blanks();
        if (pos_ < s_.size() && !starts_comment(s_[pos_]) && !is_newline(s_[pos_]))
          return error(line_start, "white space before a key or section (llama.cpp allows none)");
        if (!end_of_line()) return error(line_start, "a comment that is not UTF-8");
      } else {
        if (s_.substr(pos_, 3) == "\xef\xbb\xbf") return error(line_start, "a byte-order mark (llama.cpp reads none)");
        return error(line_start, utf8_length(s_, pos_) == 0 ? "text that is not UTF-8"
                                                          : "a line that is no key, section or comment");
      }
    }
    LlamaConfigIni ini;
    if (auto it = sections.find("*"); it != sections.end()) ini.global = std::move(it->second);
    if (auto it = sections.find("default"); it != sections.end()) ini.defaults = std::move(it->second);
    return ini;
  }

 private:
  void skip_blanks() {
    while (pos_ < s_.size() && is_blank(s_[pos_])) ++pos_;
  }

  // eol ::= ws comment? (newline / EOF), comment ::= [;#] (!newline any)*
  bool end_of_line() {
    skip_blanks();
    if (pos_ < s_.size() && starts_comment(s_[pos_])) {
      ++pos_;
      while (pos_ < s_.size() && !is_newline(s_[pos_])) {
        const size_t n = utf8_length(s_, pos_);
        if (n == 0) return false;
        pos_ += n;
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
  // blanks is looked past once (not again from each of its bytes), so this is linear.
  size_t value_stop() const {
    size_t p = pos_;
    while (p < s_.size()) {
      size_t q = p;
      while (q < s_.size() && is_blank(s_[q])) ++q;
      if (q == s_.size() || starts_comment(s_[q]) || is_newline(s_[q])) return p;
      if (q > p) {
        p = q;  // blanks inside the value
        continue;
      }
      const size_t n = utf8_length(s_, p);
      if (n == 0) return p;  // end_of_line() then fails there
      p += n;
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
