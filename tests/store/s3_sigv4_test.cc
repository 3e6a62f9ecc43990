// The SigV4 signer against the examples AWS publishes in "Signature Calculations
// for the Authorization Header: Transferring Payload in a Single Chunk" (Amazon
// S3 API reference): access key AKIAIOSFODNN7EXAMPLE, secret
// wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY, us-east-1, 20130524T000000Z,
// bucket examplebucket (virtual-hosted, so the paths have no bucket).
#include "store/s3_sigv4.h"

#include <gtest/gtest.h>

namespace kvsnap {
namespace {

constexpr const char* kEmptySha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr const char* kDate = "20130524T000000Z";

SigV4Credentials aws_example() { return {"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1", "s3"}; }

SigV4Request get(std::string path, std::vector<std::pair<std::string, std::string>> query) {
  SigV4Request r;
  r.method = "GET";
  r.path = std::move(path);
  r.query = std::move(query);
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"}, {"x-amz-date", kDate}, {"x-amz-content-sha256", kEmptySha}};
  r.payload_sha256 = kEmptySha;
  return r;
}

TEST(S3SigV4, GetObjectWithRange) {
  SigV4Request r = get("/test.txt", {});
  r.headers.emplace_back("Range", "bytes=0-9");
  EXPECT_EQ(sigv4_canonical_request(r),
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sigv4_string_to_sign(r, aws_example(), kDate),
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(sigv4_authorization(r, aws_example(), kDate),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(S3SigV4, PutObjectEncodesTheKey) {
  SigV4Request r;
  r.method = "PUT";
  r.path = "/test$file.text";
  const char* body_sha = "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072";  // "Welcome to Amazon S3."
  r.headers = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
               {"Host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-date", kDate},
               {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
               {"x-amz-content-sha256", body_sha}};
  r.payload_sha256 = body_sha;
  EXPECT_EQ(sigv4_string_to_sign(r, aws_example(), kDate),
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
  EXPECT_EQ(sigv4_authorization(r, aws_example(), kDate),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class,"
            "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(S3SigV4, QueryWithEmptyValue) {  // GET ?lifecycle
  SigV4Request r = get("/", {{"lifecycle", ""}});
  EXPECT_EQ(sigv4_authorization(r, aws_example(), kDate),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date,"
            "Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(S3SigV4, ListObjectsSortsTheQuery) {  // GET ?max-keys=2&prefix=J, given out of order
  SigV4Request r = get("/", {{"prefix", "J"}, {"max-keys", "2"}});
  EXPECT_EQ(sigv4_authorization(r, aws_example(), kDate),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date,"
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(S3SigV4, UriEncoding) {
  EXPECT_EQ(uri_encode("a b/c~d_e.f-g+h=", false), "a%20b%2Fc~d_e.f-g%2Bh%3D");
  EXPECT_EQ(uri_encode_path("/bucket/chunks/ab/x y"), "/bucket/chunks/ab/x%20y");
  EXPECT_EQ(uri_encode(std::string("\xff\x00", 2), false), "%FF%00");
  EXPECT_EQ(canonical_query({{"uploadId", "a/b"}, {"partNumber", "2"}}), "partNumber=2&uploadId=a%2Fb");
}

}  // namespace
}  // namespace kvsnap
