// The text a user writes for kvsnap, as it parses it: the store config file (parse_store_config,
// src/store/store_location.h), the S3 address in its "blobs" (parse_s3_location,
// src/store/s3_client.h), the sizes and durations of the config and of --max-bytes, --ttl and
// expire (parse_byte_size, parse_duration, src/store/eviction.h), and token lists (--tokens FILE,
// an mlx-lm cache's 'tokens' metadata: parse_token_file_text and the parse_token_list it falls
// back to, migrate/cross_engine.h), and a llama-server URL (--server, a profile's url:
// split_server_url, src/server/llama_server.h). The first byte picks the parser, the rest is the text;
// a first byte 0xff instead shows the text as listings and errors show outside text (shown_text,
// quote_text: src/base/text.h). A first byte 0xfe takes the text as a PostgreSQL catalog URL's
// password (redact_pg_url, without_pg_secrets: src/store/pg_conn.h): no message shows it.
#include "base/text.h"
#include "fuzz/fuzz_input.h"
#include "migrate/cross_engine.h"
#include "server/llama_server.h"
#include "store/eviction.h"
#include "store/pg_conn.h"
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
  if (data[0] == 0xff) {
    // What is shown moves no cursor, starts no escape sequence, reorders nothing, and is UTF-8;
    // with the lines kept, a newline and a tab are its only control characters.
    const std::string shown = kvsnap::shown_text(text), lines = kvsnap::shown_text(text, /*keep_lines=*/true);
    const std::string quoted = kvsnap::quote_text(text);
    for (const std::string* s : {&shown, &quoted})
      if (kvsnap::has_terminal_controls(*s) || !kvsnap::is_valid_utf8(*s)) std::abort();
    if (!kvsnap::is_valid_utf8(lines)) std::abort();
    for (char c : lines)
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') || c == 0x7f) std::abort();
    if (kvsnap::is_valid_utf8(text) && !kvsnap::has_terminal_controls(text) && text.find('\t') == std::string_view::npos &&
        shown != text)
      std::abort();  // text with nothing to escape is shown as it is
    return 0;
  }
  if (data[0] == 0xfe) {
    // Any password libpq takes in a URL's user part (a raw '@' or '/' is refused before any message
    // is made with the URL but the redacted one): the redacted URL and libpq's messages lose it.
    const std::string password(text);
    const std::string url = "postgresql://kv:" + password + "@db.example:5432/kvsnap?sslmode=require";
    const std::string redacted = kvsnap::redact_pg_url(url);
    if (!password.empty() && password.find_first_of("@/") == std::string::npos) {
      if (redacted != "postgresql://kv@db.example:5432/kvsnap?sslmode=require") std::abort();
      // (a password of '*'s may be made again by the masks themselves; any other never shows)
      const std::string said = kvsnap::without_pg_secrets("token \"" + password + "\" refused", url);
      if (password.find('*') == std::string::npos && said.find(password) != std::string::npos) std::abort();
    }
    (void)kvsnap::without_pg_secrets(password, "postgresql://" + password + "@h/d?password=" + password);
    return 0;
  }
  switch (data[0] % 6) {
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
    case 5: {
      auto u = kvsnap::split_server_url(std::string(text));
      if (u.ok()) {  // a URL the client can ask: a host, a port, a base path without a trailing '/'
        const kvsnap::ServerUrl& p = *u;
        if (p.scheme != "http" && p.scheme != "https") std::abort();
        if (p.host.empty() || p.host.find_first_of("@/?# ") != std::string::npos) std::abort();
        for (char c : p.scheme + p.host + p.base)  // nothing that could end a header line
          if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) std::abort();
        if (p.port < 1 || p.port > 65535) std::abort();
        if (!p.base.empty() && (p.base.front() != '/' || p.base.back() == '/')) std::abort();
        // written back from its parts, it reads the same
        const std::string host = p.host.find(':') != std::string::npos ? "[" + p.host + "]" : p.host;
        auto again = kvsnap::split_server_url(p.scheme + "://" + host + ":" + std::to_string(p.port) + p.base);
        if (!again.ok() || again->scheme != p.scheme || again->host != p.host || again->port != p.port ||
            again->base != p.base)
          std::abort();
      }
      break;
    }
  }
  return 0;
}
