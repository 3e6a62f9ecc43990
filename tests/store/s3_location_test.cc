// parse_s3_location: the S3 location string, its credentials and what messages may show.
#include <gtest/gtest.h>

#include "store/s3_client.h"

namespace kvsnap {
namespace {

TEST(S3Location, Parse) {
  Result<S3Location> l = parse_s3_location("s3+http://test%3Atester:testing@127.0.0.1:8080/bucket/some/prefix/?region=eu-west-1");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->config.endpoint, "http://127.0.0.1:8080");
  EXPECT_EQ(l->config.bucket, "bucket");
  EXPECT_EQ(l->prefix, "some/prefix");
  EXPECT_EQ(l->config.access_key, "test:tester");
  EXPECT_EQ(l->config.secret_key, "testing");
  EXPECT_EQ(l->config.region, "eu-west-1");
  EXPECT_EQ(l->redacted, "s3+http://127.0.0.1:8080/bucket/some/prefix");
  const Result<S3Location> bad = parse_s3_location("s3+http://a:supersecret@h/");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().find("supersecret"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("'s3+http://h/'"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(parse_s3_location("s3+ftp://a:b@h/b").ok());
  // an AWS secret pasted with a raw '/', '?' or '@' (they must be %2F, %3F, %40): refused, and no
  // message shows any piece of it
  for (const char* pasted : {"s3+http://AKID:Zq1/Xy2@h/b", "s3+http://AKID:Zq1/Xy2/Wv3@h/b", "s3+http://AKID:Zq1?Xy2@h/b",
                             "s3+http://AKID:Zq1/b?Xy2@h/b", "s3+http://AKID:Zq1/Xy2@h/b?foo=1"}) {
    const Result<S3Location> raw = parse_s3_location(pasted);
    ASSERT_FALSE(raw.ok()) << pasted;
    for (const char* piece : {"Zq1", "Xy2", "Wv3"})
      EXPECT_EQ(raw.status().message().find(piece), std::string::npos) << pasted << ": " << raw.status().message();
  }
  l = parse_s3_location("s3+http://AKID:Zq1@Xy2@h/b");  // a raw '@' in the user part: the last one ends it
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->config.secret_key, "Zq1@Xy2");
  EXPECT_EQ(l->redacted, "s3+http://h/b");
  l = parse_s3_location("s3+http://AKID:Zq1%2FXy2%3F%40@h/b");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->config.secret_key, "Zq1/Xy2?@");
  EXPECT_EQ(l->redacted, "s3+http://h/b");
  EXPECT_FALSE(parse_s3_location("s3+http://a:b@h/b?foo=1").ok());
}

TEST(S3Location, BareBucketWithEndpoint) {
  setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "SECRET", 1);
  Result<S3Location> l = parse_s3_location("s3://kv-cache/team-a?endpoint=http%3A%2F%2F127.0.0.1%3A9000");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->config.endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(l->config.bucket, "kv-cache");
  EXPECT_EQ(l->prefix, "team-a");
  EXPECT_EQ(l->redacted, "s3://kv-cache/team-a at http://127.0.0.1:9000");
  setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1234", 1);
  l = parse_s3_location("s3://kv-cache");
  unsetenv("AWS_ENDPOINT_URL");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->config.endpoint, "http://127.0.0.1:1234");
  l = parse_s3_location("s3://kv-cache?region=eu-west-3");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->config.endpoint, "https://s3.eu-west-3.amazonaws.com");
  EXPECT_FALSE(parse_s3_location("s3://kv-cache?endpoint=ftp://x").ok());
  EXPECT_FALSE(parse_s3_location("s3:///prefix").ok());
  // trailing '/' go; an empty segment of the key prefix is refused (s3://b//team-a once kept its
  // blobs under "/team-a/", other keys than s3://b/team-a's): neither read one way nor the other
  l = parse_s3_location("s3://kv-cache/team-a//?endpoint=http%3A%2F%2F127.0.0.1%3A9000");
  EXPECT_TRUE(l.ok() && l->prefix == "team-a") << (l.ok() ? l->prefix : l.status().ToString());
  for (const char* empty_segment : {"s3://kv-cache//team-a", "s3://kv-cache/a//b", "s3+http://a:b@h/kv-cache//x"}) {
    const Result<S3Location> r = parse_s3_location(empty_segment);
    EXPECT_FALSE(r.ok()) << empty_segment;
    EXPECT_NE(r.status().message().find("empty segment"), std::string::npos) << r.status().ToString();
  }
  // a bare address's prefix may hold an '@' (no credentials there); an endpoint may not have a user part
  l = parse_s3_location("s3://kv-cache/users/ana@x.com?endpoint=http%3A%2F%2Fh");
  EXPECT_TRUE(l.ok() && l->prefix == "users/ana@x.com") << (l.ok() ? l->prefix : l.status().ToString());
  const Result<S3Location> user = parse_s3_location("s3://kv-cache?endpoint=http%3A%2F%2Fme%3Apw42%40h");
  ASSERT_FALSE(user.ok());
  EXPECT_EQ(user.status().message().find("pw42"), std::string::npos) << user.status().message();
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
}

TEST(S3Location, CredentialsFromTheEnvironment) {
  setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "SECRET", 1);
  setenv("AWS_REGION", "ap-south-1", 1);
  const Result<S3Location> l = parse_s3_location("s3+https://s3.example.com/b");
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  unsetenv("AWS_REGION");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->config.endpoint, "https://s3.example.com");
  EXPECT_EQ(l->config.access_key, "AKID");
  EXPECT_EQ(l->config.secret_key, "SECRET");
  EXPECT_EQ(l->config.region, "ap-south-1");
  EXPECT_EQ(l->prefix, "");
  const Result<S3Location> none = parse_s3_location("s3+https://s3.example.com/b");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
}

}  // namespace
}  // namespace kvsnap
