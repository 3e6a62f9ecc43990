// The text a user writes for kvsnap, as it parses it: the store config file (parse_store_config,
// src/store/store_location.h), the S3 address in its "blobs" (parse_s3_location,
// src/store/s3_client.h), the sizes and durations of the config and of --max-bytes, --ttl and
// expire (parse_byte_size, parse_duration, src/store/eviction.h), and token lists (--tokens FILE,
// an mlx-lm cache's 'tokens' metadata: parse_token_file_text and the parse_token_list it falls
// back to, migrate/cross_engine.h). The first byte picks the parser, the rest is the text.
#include "fuzz/fuzz_input.h"
#include "migrate/cross_engine.h"
#include "store/eviction.h"
#include "store/s3_client.h"
#include "store/store_location.h"

#include <cstdlib>
#include <string>

// The same S3 environment on every machine: credentials set (so that a bare s3:// address parses
// and reaches the checks below), no endpoint or region from outside.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("AWS_ACCESS_KEY_ID", "FUZZACCESS", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "fuzz-env-secret", 1);
  for (const char* v : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"}) unsetenv(v);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text = kvsnap::fuzz::text(data + 1, size - 1);
  switch (data[0] % 5) {
    case 0: {
      auto where = kvsnap::parse_store_config(text, "/fuzz/dir/store.json");
      // a parsed config names a catalog and blobs, and a local directory for this host
      if (where.ok() && (where->catalog.empty() || where->blobs.empty() || where->local_dir.empty())) std::abort();
      break;
    }
    case 1: {
      auto s3 = kvsnap::parse_s3_location(text);
      // a parsed address names its bucket and an http(s) endpoint, and its prefix has no '/' at either end
      if (s3.ok()) {
        const kvsnap::S3Location& l = *s3;
        if (l.config.bucket.empty()) std::abort();
        if (!l.config.endpoint.starts_with("http://") && !l.config.endpoint.starts_with("https://")) std::abort();
        if (!l.prefix.empty() && (l.prefix.front() == '/' || l.prefix.back() == '/')) std::abort();
        // credentials never ride in the endpoint, nor (an s3+http(s) address's) in what messages show
        if (l.config.endpoint.find('@') != std::string::npos) std::abort();
        if (!text.starts_with("s3://") && l.redacted.find('@') != std::string::npos) std::abort();
      }
      break;
    }
    case 2: {
      auto n = kvsnap::parse_byte_size(std::string(text));
      (void)n;
      break;
    }
    case 3: {
      auto s = kvsnap::parse_duration(std::string(text));
      if (s.ok() && *s <= 0) std::abort();  // "-> seconds > 0"
      break;
    }
    case 4: {
      auto ids = kvsnap::parse_token_file_text(std::string(text), "fuzz.txt");
      if (ids.ok()) {  // what it read, written back as a list, reads the same
        std::string back;
        for (int32_t id : *ids) back += std::to_string(id) + " ";
        auto again = kvsnap::parse_token_list(back, "fuzz.txt");
        if (!again.ok() || *again != *ids) std::abort();
      }
      break;
    }
  }
  return 0;
}
