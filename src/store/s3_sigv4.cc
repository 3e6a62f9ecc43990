#include "store/s3_sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <new>

#include "base/sha256.h"

namespace kvsnap {
namespace {

using Mac = std::array<uint8_t, 32>;

Mac hmac(std::string_view key, std::string_view msg) {
  Mac out{};
  unsigned len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
           msg.size(), out.data(), &len) == nullptr) {
    throw std::bad_alloc();  // OpenSSL fails only when it cannot allocate (base/sha256.h)
  }
  return out;
}

std::string_view as_key(const Mac& m) { return {reinterpret_cast<const char*>(m.data()), m.size()}; }

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Leading and trailing blanks dropped, inner runs of blanks as one space.
std::string trim_value(std::string_view v) {
  std::string out;
  bool blank = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      blank = !out.empty();
      continue;
    }
    if (blank) out += ' ';
    blank = false;
    out += c;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> canonical_headers(const SigV4Request& r) {
  std::vector<std::pair<std::string, std::string>> h;
  for (const auto& [name, value] : r.headers) h.emplace_back(lower(name), trim_value(value));
  std::sort(h.begin(), h.end());
  return h;
}

std::string signed_header_list(const std::vector<std::pair<std::string, std::string>>& h) {
  std::string out;
  for (const auto& [name, value] : h) out += (out.empty() ? "" : ";") + name;
  return out;
}

std::string scope(const SigV4Credentials& c, std::string_view amz_date) {
  return std::string(amz_date.substr(0, 8)) + "/" + c.region + "/" + c.service + "/aws4_request";
}

}  // namespace

std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~' || (c == '/' && keep_slash)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string uri_encode_path(std::string_view path) { return uri_encode(path, /*keep_slash=*/true); }

std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> q;
  for (const auto& [k, v] : query) q.emplace_back(uri_encode(k, false), uri_encode(v, false));
  std::sort(q.begin(), q.end());
  std::string out;
  for (const auto& [k, v] : q) out += (out.empty() ? "" : "&") + k + "=" + v;
  return out;
}

std::string sigv4_canonical_request(const SigV4Request& r) {
  const auto h = canonical_headers(r);
  std::string out = r.method + "\n" + uri_encode_path(r.path) + "\n" + canonical_query(r.query) + "\n";
  for (const auto& [name, value] : h) out += name + ":" + value + "\n";
  return out + "\n" + signed_header_list(h) + "\n" + r.payload_sha256;
}

std::string sigv4_string_to_sign(const SigV4Request& r, const SigV4Credentials& c, std::string_view amz_date) {
  const std::string creq = sigv4_canonical_request(r);
  return "AWS4-HMAC-SHA256\n" + std::string(amz_date) + "\n" + scope(c, amz_date) + "\n" +
         to_hex(sha256_of(std::as_bytes(std::span(creq.data(), creq.size()))));
}

std::string sigv4_authorization(const SigV4Request& r, const SigV4Credentials& c, std::string_view amz_date) {
  const Mac k_date = hmac("AWS4" + c.secret_key, amz_date.substr(0, 8));
  const Mac k_region = hmac(as_key(k_date), c.region);
  const Mac k_service = hmac(as_key(k_region), c.service);
  const Mac k_signing = hmac(as_key(k_service), "aws4_request");
  const Mac sig = hmac(as_key(k_signing), sigv4_string_to_sign(r, c, amz_date));
  return "AWS4-HMAC-SHA256 Credential=" + c.access_key + "/" + scope(c, amz_date) +
         ",SignedHeaders=" + signed_header_list(canonical_headers(r)) + ",Signature=" + to_hex(std::span<const uint8_t>(sig));
}

}  // namespace kvsnap
