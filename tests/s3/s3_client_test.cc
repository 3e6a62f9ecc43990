// S3Client against a real Swift + s3api on loopback (tests/beds/swift-s3.sh).
#include "store/s3_client.h"

#include <gtest/gtest.h>

#include "s3/s3_bed.h"

namespace kvsnap {
namespace {

using s3test::pattern;

std::unique_ptr<S3Client> client_with_bucket(S3Config cfg) {
  auto c = std::make_unique<S3Client>(std::move(cfg));
  const Status s = c->create_bucket();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

TEST(S3Client, RoundTripHeadDelete) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  auto c = client_with_bucket(*cfg);
  EXPECT_TRUE(c->create_bucket().ok()) << "a bucket we own again is fine";
  const auto data = pattern(100000, 1);
  ASSERT_TRUE(c->put("p/chunks/ab/one", data).ok());
  ASSERT_TRUE(c->put("p/chunks/ab/one", data).ok()) << "the same content again: idempotent";
  const Result<std::vector<std::byte>> got = c->get("p/chunks/ab/one", 1 << 20);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, data);
  const Result<std::optional<uint64_t>> size = c->head("p/chunks/ab/one");
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(size->value_or(0), data.size());
  ASSERT_TRUE(c->put("empty", {}).ok());
  EXPECT_EQ(c->get("empty", 10)->size(), 0u);
  ASSERT_TRUE(c->put("odd name/with space+plus&amp=é", data).ok()) << "keys are encoded";
  EXPECT_EQ(*c->get("odd name/with space+plus&amp=é", 1 << 20), data);

  ASSERT_TRUE(c->remove("p/chunks/ab/one").ok());
  EXPECT_FALSE(c->head("p/chunks/ab/one")->has_value());
  EXPECT_TRUE(c->remove("p/chunks/ab/one").ok()) << "absent is fine";
}

TEST(S3Client, MissingObjectAndSizeCap) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  auto c = client_with_bucket(*cfg);
  const Result<std::vector<std::byte>> missing = c->get("nope", 100);
  ASSERT_EQ(missing.status().code(), Code::kNotFound) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find(c->url("nope")), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find("HTTP 404 NoSuchKey"), std::string::npos) << missing.status().message();
  EXPECT_FALSE(c->head("nope")->has_value());

  ASSERT_TRUE(c->put("big", pattern(5000, 2)).ok());
  const Result<std::vector<std::byte>> capped = c->get("big", 4999);
  EXPECT_EQ(capped.status().code(), Code::kInvalidArgument) << capped.status().ToString();
  EXPECT_EQ(c->get("big", 5000)->size(), 5000u);

  S3Config other = *cfg;
  other.bucket += "-absent";
  S3Client no_bucket(other);
  EXPECT_EQ(no_bucket.get("x", 10).status().code(), Code::kNotFound);
}

TEST(S3Client, RangeReads) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  auto c = client_with_bucket(*cfg);
  const auto data = pattern(300000, 3);
  ASSERT_TRUE(c->put("pack", data).ok());
  for (const auto& [off, n] : std::vector<std::pair<size_t, size_t>>{{0, 1}, {0, 300000}, {12345, 1000}, {299999, 1}}) {
    std::vector<std::byte> buf(n);
    const Status s = c->get_range("pack", off, buf);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(std::equal(buf.begin(), buf.end(), data.begin() + off)) << off << "+" << n;
  }
  std::vector<std::byte> past(10);
  const Status s = c->get_range("pack", 299995, past);
  EXPECT_EQ(s.code(), Code::kCorruption) << s.ToString();
  EXPECT_EQ(c->get_range("pack", 400000, past).code(), Code::kCorruption);
  EXPECT_EQ(c->get_range("nope", 0, past).code(), Code::kNotFound);
}

TEST(S3Client, ListPaginates) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  auto c = client_with_bucket(*cfg);
  std::vector<std::string> keys;
  for (int i = 0; i < 23; ++i) {
    char k[64];
    std::snprintf(k, sizeof k, "pre/fix/%03d", i);
    keys.push_back(k);
    ASSERT_TRUE(c->put(k, pattern(size_t(i), uint32_t(i))).ok());
  }
  ASSERT_TRUE(c->put("other/x", pattern(1, 1)).ok());
  const Result<S3ListPage> first = c->list_page("pre/", "", 5);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->objects.size(), 5u);
  EXPECT_TRUE(first->truncated);
  const Result<std::vector<S3Object>> all = c->list("pre/", 5);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ((*all)[i].key, keys[i]);
    EXPECT_EQ((*all)[i].size, i);
  }
  EXPECT_EQ(c->list("", 1000)->size(), keys.size() + 1);
  EXPECT_TRUE(c->list("none/", 5)->empty());
}

TEST(S3Client, MultipartAboveTheThreshold) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  cfg->multipart_threshold = 5 << 20;
  cfg->part_size = 5 << 20;
  auto c = client_with_bucket(*cfg);
  const auto data = pattern((11 << 20) + 12345, 4);  // three parts, the last one short
  const uint64_t before = c->attempts();
  const Status put = c->put("packs/big.pack", data);
  ASSERT_TRUE(put.ok()) << put.ToString();
  EXPECT_EQ(c->attempts() - before, 5u) << "create, three parts, complete";
  EXPECT_EQ(c->head("packs/big.pack")->value_or(0), data.size());
  const Result<std::vector<std::byte>> got = c->get("packs/big.pack", 64 << 20);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == data);
  std::vector<std::byte> mid(1 << 20);  // across the first part boundary
  ASSERT_TRUE(c->get_range("packs/big.pack", (5 << 20) - 1000, mid).ok());
  EXPECT_TRUE(std::equal(mid.begin(), mid.end(), data.begin() + (5 << 20) - 1000));
  // No segments left visible beside the object: the listing shows one key.
  EXPECT_EQ(c->list("packs/", 1000)->size(), 1u);
}

// A review's finding: a CompleteMultipartUpload is retried on a timeout or a 5xx; when the first try
// went through and only its reply was lost, the retry gets NoSuchUpload, and a complete pack became a
// failed save. The object whose ETag is these parts' (MD5 of their MD5s, "-N") says the upload is whole.
TEST(S3Client, ACompleteSentAgainAfterItWentThroughSucceeds) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  auto c = client_with_bucket(*cfg);
  const std::string key = "packs/twice.pack";
  const auto first = pattern(5 << 20, 5), last = pattern(1000, 6);
  auto id = c->start_upload(key);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto e1 = c->upload_part(key, *id, 1, first);
  auto e2 = c->upload_part(key, *id, 2, last);
  ASSERT_TRUE(e1.ok() && e2.ok());
  ASSERT_TRUE(c->complete_upload(key, *id, {*e1, *e2}).ok());
  // Swift (like S3, for a while) answers a second complete of the same upload 200 itself; a server that
  // has forgotten the upload answers NoSuchUpload, as it does for an id it never gave.
  const Status again = c->complete_upload(key, *id, {*e1, *e2});
  EXPECT_TRUE(again.ok()) << again.ToString();
  const Status forgotten = c->complete_upload(key, "upload-it-forgot", {*e1, *e2});
  EXPECT_TRUE(forgotten.ok()) << forgotten.ToString();
  // Other parts are no proof: the server's NoSuchUpload stands.
  const Status other = c->complete_upload(key, "upload-it-forgot", {*e2, *e1});
  EXPECT_EQ(other.code(), Code::kNotFound) << other.ToString();
  EXPECT_EQ(c->complete_upload("packs/none.pack", "upload-it-forgot", {*e1, *e2}).code(), Code::kNotFound);
  EXPECT_EQ(c->head(key)->value_or(0), first.size() + last.size());
}

TEST(S3Client, FromAFile) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  cfg->multipart_threshold = 5 << 20;
  cfg->part_size = 5 << 20;
  auto c = client_with_bucket(*cfg);
  const auto data = pattern((6 << 20) + 7, 5);
  const std::string path = testing::TempDir() + "/s3-from-file";
  {
    auto w = posix_io().open_write(path, false);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->append(data).ok());
    ASSERT_TRUE((*w)->close().ok());
  }
  auto r = posix_io().open_read(path);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(c->put_file("f", **r).ok());
  EXPECT_TRUE(*c->get("f", 64 << 20) == data);
  (void)posix_io().remove(path);
}

TEST(S3Client, WrongSecretIsAClearError) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  auto good = client_with_bucket(*cfg);
  S3Config bad = *cfg;
  bad.secret_key = "not-the-secret-42";
  S3Client c(bad);
  const Status s = c.put("x", pattern(10, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.message().find("HTTP 403"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("SignatureDoesNotMatch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("check the access key and secret"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("not-the-secret-42"), std::string::npos) << "the secret is never in a message";
  EXPECT_EQ(c.attempts(), 1u) << "a 403 is final";
  S3Config unknown = *cfg;
  unknown.access_key = "nobody:here";
  EXPECT_NE(S3Client(unknown).get("x", 10).status().message().find("HTTP 403"), std::string::npos);
}

TEST(S3Client, ServerGoneBoundedRetriesThenAClearError) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  cfg->retry = {.max_attempts = 4, .base_delay_ms = 20, .max_delay_ms = 100, .max_total_ms = 30000};
  auto c = client_with_bucket(*cfg);
  ASSERT_TRUE(c->put("before", pattern(10, 1)).ok());
  ASSERT_EQ(s3test::bed_control("pause"), 0) << "could not stop the bed's proxy";
  const uint64_t before = c->attempts();
  const Result<std::vector<std::byte>> r = c->get("before", 100);
  const uint64_t tries = c->attempts() - before;
  const int resumed = s3test::bed_control("resume");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIOError);
  EXPECT_EQ(tries, 4u);
  EXPECT_NE(r.status().message().find("GET " + c->url("before")), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("after 4 attempts"), std::string::npos) << r.status().message();
  ASSERT_EQ(resumed, 0) << "the bed's proxy did not come back";
  EXPECT_TRUE(c->get("before", 100).ok()) << "the same client works once the server is back";
}

TEST(S3Client, TotalTimeBoundStopsRetries) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  cfg->endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  cfg->retry = {.max_attempts = 1000, .base_delay_ms = 20, .max_delay_ms = 20, .max_total_ms = 2000};
  S3Client c(*cfg);
  const Status s = c.remove("x");
  ASSERT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_LT(c.attempts(), 1000u) << "max_total_ms ends the retries before max_attempts";
  EXPECT_GT(c.attempts(), 1u);
}

}  // namespace
}  // namespace kvsnap
