// AWS Signature Version 4 for S3 requests: the Authorization header of one
// request, from its method, path, query, headers and payload hash.
//
// Why kvsnap signs itself (OpenSSL HMAC-SHA256) instead of curl's
// CURLOPT_AWS_SIGV4: the signer is a pure function of its inputs, so a unit
// test checks it against AWS's published examples (tests/store/s3_sigv4_test.cc);
// and Debian 12's curl 7.88 did not work against the Swift bed unaided: it sends
// no x-amz-content-sha256 (s3api answers "Missing required header for this
// request: x-amz-content-sha256"), and its --user splits the key pair at the
// first ':', which tempauth's access keys ("account:user") contain. Signing here
// also fixes exactly which headers are signed (every one the client sends).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsnap {

struct SigV4Credentials {
  std::string access_key;
  std::string secret_key;  // never logged, never in a message
  std::string region = "us-east-1";
  std::string service = "s3";
};

struct SigV4Request {
  std::string method;  // "GET", "PUT", ...
  // The path as the server sees it, not yet encoded ("/bucket/a key"): the
  // signer and the URL use uri_encode_path() of it.
  std::string path;
  // Unencoded names and values; an empty value is "name=" (e.g. ?uploads).
  std::vector<std::pair<std::string, std::string>> query;
  // Every header sent, all signed: at least host, x-amz-date and
  // x-amz-content-sha256. Names in any case; values are trimmed.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256;  // lowercase hex, or "UNSIGNED-PAYLOAD"
};

// RFC 3986 unreserved characters kept, every other byte %XX (uppercase), as
// SigV4 requires; '/' kept in paths, encoded in query names and values.
std::string uri_encode(std::string_view s, bool keep_slash);
std::string uri_encode_path(std::string_view path);
// "a=1&b=" sorted by encoded name then value: the canonical query string,
// also what the URL carries.
std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query);

// The value of the Authorization header for `r` signed at `amz_date`
// ("20130524T000000Z", the request's x-amz-date).
std::string sigv4_authorization(const SigV4Request& r, const SigV4Credentials& c, std::string_view amz_date);

// The canonical request and string to sign, for tests and for messages on a
// signature mismatch (they hold no secret).
std::string sigv4_canonical_request(const SigV4Request& r);
std::string sigv4_string_to_sign(const SigV4Request& r, const SigV4Credentials& c, std::string_view amz_date);

}  // namespace kvsnap
