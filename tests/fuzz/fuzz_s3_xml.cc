// The S3 replies a server sends (src/store/s3_xml.h): every parser on the same body.
#include "fuzz/fuzz_input.h"
#include "store/s3_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body = kvsnap::fuzz::text(data, size);
  (void)kvsnap::parse_list_objects_v2(body, "fuzz");
  (void)kvsnap::parse_s3_error(body);
  (void)kvsnap::parse_upload_id(body, "fuzz");
  return 0;
}
