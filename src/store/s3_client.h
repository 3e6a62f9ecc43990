// A small client for S3-compatible object storage (AWS S3, Ceph RGW, Swift's
// s3api, MinIO): the calls a content-addressed blob store needs, over libcurl
// with SigV4 signing of our own (store/s3_sigv4.h says why).
//
// What it promises:
//   - Path-style URLs: <endpoint>/<bucket>/<key>; keys are UTF-8, encoded here.
//   - put() is one PUT up to `multipart_threshold` bytes and a multipart upload
//     above (parts of `part_size`, `upload_threads` at a time, aborted when any step fails, so a failed
//     upload leaves no object and no parts). Either way the object appears
//     whole or not at all, and a PUT of the same key and bytes again is
//     harmless: content-addressed writers may race.
//   - Retries with exponential backoff and jitter on connection errors,
//     timeouts, HTTP 5xx, 429 and the S3 codes SlowDown/RequestTimeout/
//     InternalError; bounded by `retry.max_attempts` and `retry.max_total_ms`.
//     Every other answer is final.
//   - Errors name the method and URL (never the credentials), the HTTP status
//     and the S3 error code and message: kNotFound for 404 (absent object or
//     bucket), kCorruption for a reply that contradicts the request (a short
//     range, bad XML), kInvalidArgument for an object over the caller's size
//     cap, kIOError for everything else (refused, timed out, 403, 5xx).
//   - Replies are untrusted: bodies are capped (a GET at the caller's max, XML
//     at 16 MiB, an error body cut at 64 KiB), XML goes through store/s3_xml.h.
//   - Thread-safe: calls may run in parallel; connections are reused through a
//     small pool of curl handles.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "store/s3_xml.h"

namespace kvsnap {

struct S3RetryPolicy {
  int max_attempts = 6;      // the first one included
  int base_delay_ms = 100;   // before the second attempt; doubled each time
  int max_delay_ms = 5000;   // cap of one delay (before jitter)
  int max_total_ms = 60000;  // no retry starts after this much time since the first attempt
};

struct S3Config {
  std::string endpoint;  // "http://127.0.0.1:9000" or "https://s3.amazonaws.com"
  std::string bucket;
  std::string region = "us-east-1";
  std::string access_key;
  std::string secret_key;  // never logged, never in a message
  uint64_t multipart_threshold = 64ull << 20;
  uint64_t part_size = 16ull << 20;  // S3 wants >= 5 MiB for every part but the last
  int upload_threads = 4;             // parts of one multipart upload in flight at once
  long connect_timeout_ms = 5000;
  long low_speed_time_s = 60;  // a transfer under 1 KiB/s for this long is a timeout
  S3RetryPolicy retry;
};

// An S3 location, one of
//   s3://BUCKET[/PREFIX][?endpoint=URL&region=R]   the endpoint from ?endpoint=, else
//       AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com
//   s3+http[s]://[ACCESS:SECRET@]HOST[:PORT]/BUCKET[/PREFIX][?region=R]
// ACCESS and SECRET are percent-decoded ("test%3Atester"). Without them,
// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; without ?region, AWS_REGION,
// AWS_DEFAULT_REGION, then us-east-1.
struct S3Location {
  S3Config config;
  std::string prefix;    // no leading or trailing '/'; may be empty
  std::string redacted;  // the location without credentials, for messages
};
Result<S3Location> parse_s3_location(std::string_view location);

class S3Client {
 public:
  explicit S3Client(S3Config config);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Config& config() const { return cfg_; }
  // <endpoint>/<bucket>/<key>, for messages (no credentials).
  std::string url(std::string_view key) const;

  // Creates the bucket; one the caller already owns is fine.
  Status create_bucket();
  Status put(std::string_view key, std::span<const std::byte> data);
  // PUT only if no object is there: OK when it was written or one was there already (the caller
  // reads which). A HEAD first, then the PUT with If-None-Match: * (412 when one appeared since);
  // a server that ignores the condition (Swift's s3api) leaves the moment between the two open, and
  // one that refuses it (501, or NotImplemented) gets a plain PUT.
  Status put_if_absent(std::string_view key, std::span<const std::byte> data);
  // The same from a file (a pack staged on disk), read a part at a time.
  Status put_file(std::string_view key, const ReadableFile& src);
  // The whole object; kInvalidArgument when it is larger than `max_bytes`.
  Result<std::vector<std::byte>> get(std::string_view key, uint64_t max_bytes);
  // The same into `out` (resized; a reused buffer keeps its capacity).
  Status get_into(std::string_view key, uint64_t max_bytes, std::vector<std::byte>& out);
  // Exactly dst.size() bytes at `offset` (a Range GET); kCorruption when the
  // object ends before.
  Status get_range(std::string_view key, uint64_t offset, std::span<std::byte> dst);
  // The object's size, or nullopt when it does not exist.
  Result<std::optional<uint64_t>> head(std::string_view key);
  // Deletes the object; an absent one is fine.
  Status remove(std::string_view key);
  // One page of keys under `prefix` (ListObjectsV2); `token` from the previous page.
  Result<S3ListPage> list_page(std::string_view prefix, const std::string& token, int max_keys);
  // Every object under `prefix`, following continuation tokens.
  Result<std::vector<S3Object>> list(std::string_view prefix, int page_size = 1000);

  // Every incomplete multipart upload whose key starts with `prefix`
  // (ListMultipartUploads, following its markers).
  Result<std::vector<S3Upload>> list_uploads(std::string_view prefix);
  // Starts a multipart upload (CreateMultipartUpload); its id. put() uses it, and
  // S3BlobStore streams a pack through it; tests use it to leave an upload behind.
  Result<std::string> start_upload(std::string_view key);
  // One part (UploadPart; numbers from 1, every part but the last >= 5 MiB); its ETag.
  Result<std::string> upload_part(std::string_view key, const std::string& upload_id, int part_number,
                                  std::span<const std::byte> data);
  // CompleteMultipartUpload of parts 1..etags.size(): the object appears whole.
  Status complete_upload(std::string_view key, const std::string& upload_id, const std::vector<std::string>& etags);
  // AbortMultipartUpload: its parts are deleted; one already gone is fine.
  Status abort_upload(std::string_view key, const std::string& upload_id);

  // HTTP attempts made so far, retries included (tests check the retry bound).
  uint64_t attempts() const;

  struct Call;
  struct Reply;

 private:
  Result<Reply> perform(Call& call);
  Reply perform_once(Call& call);
  Status multipart(std::string_view key, const ReadableFile& src);
  Status put_part_range(std::string_view key, const ReadableFile& src, uint64_t offset, uint64_t n,
                        std::vector<std::byte>& buf, const std::vector<std::pair<std::string, std::string>>& query,
                        std::string* etag);
  void* take_handle();
  void give_handle(void* h);

  S3Config cfg_;
  std::string host_;  // the endpoint's authority: the signed Host header
  mutable std::mutex mu_;
  std::vector<void*> idle_;  // CURL* ready for reuse, guarded by mu_
  uint64_t attempts_ = 0;    // guarded by mu_
};

}  // namespace kvsnap
