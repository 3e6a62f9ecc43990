// The few S3 XML replies the client reads, parsed from untrusted bytes.
//
// A small hand parser (no libxml2/expat dependency for five tags): elements,
// attributes (skipped), text with the five named entities and numeric
// character references, comments, CDATA, the <?xml?> declaration. No DTDs
// (a <!DOCTYPE is refused, so no entity expansion). Bounded: nesting depth 32,
// element count 100,000; the caller bounds the bytes. Anything malformed is
// kCorruption naming `what` (the URL); it never crashes (fuzz_s3_xml).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvsnap {

struct XmlElement {
  std::string name;  // local name: a namespace prefix ("s3:Key") is dropped
  std::string text;  // the element's own text, entities decoded
  std::vector<XmlElement> children;

  // The first child named `name`, or nullptr.
  const XmlElement* child(std::string_view name) const;
  // The text of the first child named `name`; "" when there is none.
  std::string child_text(std::string_view name) const;
};

// The document's root element.
Result<XmlElement> parse_xml(std::string_view doc, const std::string& what);

struct S3Object {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // quotes removed
};

// One page of ListObjectsV2 (<ListBucketResult>).
struct S3ListPage {
  std::vector<S3Object> objects;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken when truncated
};
Result<S3ListPage> parse_list_objects_v2(std::string_view doc, const std::string& what);

// <Error><Code>..</Code><Message>..</Message></Error>: empty fields when the
// body is not an S3 error (a proxy's HTML page, nothing).
struct S3ErrorBody {
  std::string code;
  std::string message;
};
S3ErrorBody parse_s3_error(std::string_view doc);

// One incomplete multipart upload (an <Upload> of ListMultipartUploads).
struct S3Upload {
  std::string key;
  std::string upload_id;
  std::string initiated;  // as the server wrote it (ISO 8601 UTC)
};
// One page of ListMultipartUploads (<ListMultipartUploadsResult>).
struct S3UploadsPage {
  std::vector<S3Upload> uploads;
  bool truncated = false;
  std::string next_key_marker, next_upload_id_marker;  // when truncated
};
Result<S3UploadsPage> parse_list_uploads(std::string_view doc, const std::string& what);

// <InitiateMultipartUploadResult><UploadId>.
Result<std::string> parse_upload_id(std::string_view doc, const std::string& what);

}  // namespace kvsnap
