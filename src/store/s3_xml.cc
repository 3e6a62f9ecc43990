#include "store/s3_xml.h"

#include <charconv>

#include "base/text.h"

namespace kvsnap {
namespace {

constexpr int kMaxDepth = 32;
constexpr size_t kMaxElements = 100000;  // a full ListObjectsV2 page (1000 keys) has ~5000

class Parser {
 public:
  Parser(std::string_view s, const std::string& what) : s_(s), what_(what) {}

  Result<XmlElement> document() {
    KV_RETURN_IF_ERROR(skip_misc());
    if (!starts("<")) return fail("no root element");
    XmlElement root;
    KV_RETURN_IF_ERROR(element(root, 0));
    KV_RETURN_IF_ERROR(skip_misc());
    if (pos_ != s_.size()) return fail("bytes after the root element");
    return root;
  }

 private:
  Status fail(const std::string& why) const {
    return Status::Corruption(what_ + ": bad XML at byte " + std::to_string(pos_) + ": " + why);
  }
  bool starts(std::string_view p) const { return s_.substr(pos_, p.size()) == p; }
  static bool space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
  void skip_space() {
    while (pos_ < s_.size() && space(s_[pos_])) ++pos_;
  }
  // Moves past the next `end`; false when there is none.
  bool skip_past(std::string_view end) {
    const size_t at = s_.find(end, pos_);
    if (at == std::string_view::npos) return false;
    pos_ = at + end.size();
    return true;
  }

  // Blanks, comments and processing instructions between elements.
  Status skip_misc() {
    for (;;) {
      skip_space();
      if (starts("<?")) {
        if (!skip_past("?>")) return fail("unterminated <?");
      } else if (starts("<!--")) {
        if (!skip_past("-->")) return fail("unterminated comment");
      } else if (starts("<!")) {
        return fail("DOCTYPE and declarations are not accepted");
      } else {
        return Status::OK();
      }
    }
  }

  Result<std::string> name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && !space(s_[pos_]) && s_[pos_] != '>' && s_[pos_] != '/' && s_[pos_] != '=' &&
           s_[pos_] != '<')
      ++pos_;
    if (pos_ == start) return fail("missing name");
    return std::string(s_.substr(start, pos_ - start));
  }

  static std::string local(const std::string& n) {
    const size_t colon = n.rfind(':');
    return colon == std::string::npos ? n : n.substr(colon + 1);
  }

  // Attributes are skipped (S3 puts only xmlns there); quoted values may hold '>'.
  Status skip_attributes() {
    for (;;) {
      skip_space();
      if (pos_ >= s_.size()) return fail("unterminated tag");
      if (s_[pos_] == '>' || s_[pos_] == '/') return Status::OK();
      KV_ASSIGN_OR_RETURN(std::string attr, name());
      (void)attr;
      skip_space();
      if (!starts("=")) return fail("attribute without value");
      ++pos_;
      skip_space();
      if (pos_ >= s_.size() || (s_[pos_] != '"' && s_[pos_] != '\'')) return fail("unquoted attribute value");
      const char q = s_[pos_++];
      const size_t end = s_.find(q, pos_);
      if (end == std::string_view::npos) return fail("unterminated attribute value");
      pos_ = end + 1;
    }
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  // `pos_` is at '&'.
  Status entity(std::string& out) {
    const size_t semi = s_.find(';', pos_);
    if (semi == std::string_view::npos || semi - pos_ > 12) return fail("bad entity");
    const std::string_view e = s_.substr(pos_ + 1, semi - pos_ - 1);
    pos_ = semi + 1;
    if (e == "amp") out += '&';
    else if (e == "lt") out += '<';
    else if (e == "gt") out += '>';
    else if (e == "quot") out += '"';
    else if (e == "apos") out += '\'';
    else if (e.size() >= 2 && e[0] == '#') {
      const bool hex = e[1] == 'x' || e[1] == 'X';
      const std::string_view digits = e.substr(hex ? 2 : 1);
      uint32_t cp = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
      if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || cp == 0 || cp > 0x10ffff ||
          (cp >= 0xd800 && cp <= 0xdfff))
        return fail("bad character reference");
      append_utf8(out, cp);
    } else {
      return fail("unknown entity &" + std::string(e.substr(0, 12)) + ";");
    }
    return Status::OK();
  }

  // `pos_` is at '<' of a start tag.
  Status element(XmlElement& el, int depth) {
    if (depth >= kMaxDepth) return fail("nested deeper than " + std::to_string(kMaxDepth));
    if (++elements_ > kMaxElements) return fail("more than " + std::to_string(kMaxElements) + " elements");
    ++pos_;
    KV_ASSIGN_OR_RETURN(const std::string tag, name());
    el.name = local(tag);
    KV_RETURN_IF_ERROR(skip_attributes());
    if (starts("/>")) {
      pos_ += 2;
      return Status::OK();
    }
    ++pos_;  // '>'
    for (;;) {
      if (pos_ >= s_.size()) return fail("<" + quote_text(tag, 40) + "> is not closed");
      const char c = s_[pos_];
      if (c == '&') {
        KV_RETURN_IF_ERROR(entity(el.text));
      } else if (c != '<') {
        el.text += c;
        ++pos_;
      } else if (starts("</")) {
        pos_ += 2;
        KV_ASSIGN_OR_RETURN(const std::string end, name());
        skip_space();
        if (end != tag || !starts(">")) return fail("</" + quote_text(end, 40) + "> closes <" + quote_text(tag, 40) + ">");
        ++pos_;
        return Status::OK();
      } else if (starts("<!--")) {
        if (!skip_past("-->")) return fail("unterminated comment");
      } else if (starts("<![CDATA[")) {
        const size_t start = pos_ + 9;
        if (!skip_past("]]>")) return fail("unterminated CDATA");
        el.text.append(s_.substr(start, pos_ - 3 - start));
      } else if (starts("<?")) {
        if (!skip_past("?>")) return fail("unterminated <?");
      } else if (starts("<!")) {
        return fail("declarations are not accepted inside elements");
      } else {
        el.children.emplace_back();
        KV_RETURN_IF_ERROR(element(el.children.back(), depth + 1));
      }
    }
  }

  std::string_view s_;
  const std::string& what_;
  size_t pos_ = 0;
  size_t elements_ = 0;
};

Result<uint64_t> parse_u64(const std::string& s, const std::string& what, const char* field) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size())
    return Status::Corruption(what + ": " + field + " " + quote_text(s, 40) + " is not a byte count");
  return v;
}

std::string unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

}  // namespace

const XmlElement* XmlElement::child(std::string_view n) const {
  for (const XmlElement& c : children)
    if (c.name == n) return &c;
  return nullptr;
}

std::string XmlElement::child_text(std::string_view n) const {
  const XmlElement* c = child(n);
  return c ? c->text : std::string();
}

Result<XmlElement> parse_xml(std::string_view doc, const std::string& what) { return Parser(doc, what).document(); }

Result<S3ListPage> parse_list_objects_v2(std::string_view doc, const std::string& what) {
  KV_ASSIGN_OR_RETURN(const XmlElement root, parse_xml(doc, what));
  if (root.name != "ListBucketResult")
    return Status::Corruption(what + ": expected <ListBucketResult>, got <" + quote_text(root.name, 40) + ">");
  S3ListPage page;
  for (const XmlElement& c : root.children) {
    if (c.name != "Contents") continue;
    S3Object o;
    o.key = c.child_text("Key");
    if (o.key.empty()) return Status::Corruption(what + ": a <Contents> without <Key>");
    KV_ASSIGN_OR_RETURN(o.size, parse_u64(c.child_text("Size"), what, "<Size>"));
    o.etag = unquote(c.child_text("ETag"));
    page.objects.push_back(std::move(o));
  }
  const std::string truncated = root.child_text("IsTruncated");
  page.truncated = truncated == "true";
  if (page.truncated) {
    page.next_token = root.child_text("NextContinuationToken");
    if (page.next_token.empty())
      return Status::Corruption(what + ": <IsTruncated> is true but there is no <NextContinuationToken>");
  }
  return page;
}

S3ErrorBody parse_s3_error(std::string_view doc) {
  const Result<XmlElement> root = parse_xml(doc, "error body");
  if (!root.ok() || root->name != "Error") return {};
  return {root->child_text("Code"), root->child_text("Message")};
}

Result<S3UploadsPage> parse_list_uploads(std::string_view doc, const std::string& what) {
  KV_ASSIGN_OR_RETURN(const XmlElement root, parse_xml(doc, what));
  if (root.name != "ListMultipartUploadsResult")
    return Status::Corruption(what + ": expected <ListMultipartUploadsResult>, got <" + quote_text(root.name, 40) + ">");
  S3UploadsPage page;
  for (const XmlElement& c : root.children) {
    if (c.name != "Upload") continue;
    S3Upload u{c.child_text("Key"), c.child_text("UploadId"), c.child_text("Initiated")};
    if (u.key.empty() || u.upload_id.empty()) return Status::Corruption(what + ": an <Upload> without <Key> or <UploadId>");
    page.uploads.push_back(std::move(u));
  }
  page.truncated = root.child_text("IsTruncated") == "true";
  if (page.truncated) {
    page.next_key_marker = root.child_text("NextKeyMarker");
    page.next_upload_id_marker = root.child_text("NextUploadIdMarker");
    if (page.next_key_marker.empty())
      return Status::Corruption(what + ": <IsTruncated> is true but there is no <NextKeyMarker>");
  }
  return page;
}

Result<std::string> parse_upload_id(std::string_view doc, const std::string& what) {
  KV_ASSIGN_OR_RETURN(const XmlElement root, parse_xml(doc, what));
  std::string id = root.child_text("UploadId");
  if (root.name != "InitiateMultipartUploadResult" || id.empty())
    return Status::Corruption(what + ": no <UploadId> in the reply to CreateMultipartUpload");
  return id;
}

}  // namespace kvsnap
