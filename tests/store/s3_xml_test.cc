// The S3 reply parser on real replies (as Swift's s3api writes them) and on hostile ones.
#include "store/s3_xml.h"

#include <gtest/gtest.h>

namespace kvsnap {
namespace {

TEST(S3Xml, ListMultipartUploads) {
  auto p = parse_list_uploads(
      "<?xml version=\"1.0\"?><ListMultipartUploadsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<Bucket>b</Bucket><IsTruncated>true</IsTruncated><NextKeyMarker>p/k2</NextKeyMarker>"
      "<NextUploadIdMarker>id2</NextUploadIdMarker>"
      "<Upload><Key>p/k1</Key><UploadId>id1</UploadId><Initiated>2026-11-28T10:00:00.000Z</Initiated></Upload>"
      "<Upload><Key>p/k2</Key><UploadId>id2</UploadId><Initiated>2026-11-28T11:00:00.000Z</Initiated></Upload>"
      "</ListMultipartUploadsResult>",
      "test");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->uploads.size(), 2u);
  EXPECT_EQ(p->uploads[1].key, "p/k2");
  EXPECT_EQ(p->uploads[1].upload_id, "id2");
  EXPECT_EQ(p->uploads[0].initiated, "2026-11-28T10:00:00.000Z");
  EXPECT_TRUE(p->truncated);
  EXPECT_EQ(p->next_key_marker, "p/k2");
  EXPECT_EQ(p->next_upload_id_marker, "id2");
  EXPECT_EQ(parse_list_uploads("<ListMultipartUploadsResult><Upload><Key>k</Key></Upload></ListMultipartUploadsResult>", "t")
                .status().code(), Code::kCorruption);
  EXPECT_EQ(parse_list_uploads("<ListMultipartUploadsResult><IsTruncated>true</IsTruncated></ListMultipartUploadsResult>", "t")
                .status().code(), Code::kCorruption);
  EXPECT_EQ(parse_list_uploads("<ListBucketResult/>", "t").status().code(), Code::kCorruption);
}

TEST(S3Xml, ListObjectsV2Page) {
  const std::string doc =
      "<?xml version='1.0' encoding='UTF-8'?>\n"
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix>p/</Prefix>"
      "<KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>cC9i</NextContinuationToken>"
      "<Contents><Key>p/a&amp;b</Key><LastModified>2026-11-28T06:57:19.000Z</LastModified>"
      "<ETag>\"0cc175b9c0f1b6a831c399e269772661\"</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>"
      "<Contents><Key><![CDATA[p/<c>]]></Key><Size>5242880</Size></Contents>"
      "</ListBucketResult>";
  const Result<S3ListPage> page = parse_list_objects_v2(doc, "list");
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "p/a&b");
  EXPECT_EQ(page->objects[0].size, 1u);
  EXPECT_EQ(page->objects[0].etag, "0cc175b9c0f1b6a831c399e269772661");
  EXPECT_EQ(page->objects[1].key, "p/<c>");
  EXPECT_EQ(page->objects[1].size, 5242880u);
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "cC9i");
}

TEST(S3Xml, EmptyListAndEntities) {
  const Result<S3ListPage> page =
      parse_list_objects_v2("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>", "list");
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->objects.empty());
  EXPECT_FALSE(page->truncated);
  const Result<XmlElement> e = parse_xml("<a>&#65;&#x42;&lt;&gt;&quot;&apos;&#xe9;<!-- c --></a>", "t");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->text, "AB<>\"'\xc3\xa9");
}

TEST(S3Xml, ErrorAndUploadId) {
  const S3ErrorBody err = parse_s3_error(
      "<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>NoSuchKey</Code><Message>The specified key does not "
      "exist.</Message><Key>x</Key></Error>");
  EXPECT_EQ(err.code, "NoSuchKey");
  EXPECT_EQ(err.message, "The specified key does not exist.");
  EXPECT_TRUE(parse_s3_error("<html>502 Bad Gateway</html>").code.empty());
  EXPECT_TRUE(parse_s3_error("").code.empty());
  const Result<std::string> id = parse_upload_id(
      "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>abc-1</UploadId>"
      "</InitiateMultipartUploadResult>", "create");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "abc-1");
  EXPECT_EQ(parse_upload_id("<InitiateMultipartUploadResult/>", "create").status().code(), Code::kCorruption);
}

TEST(S3Xml, HostileInputIsCorruption) {
  const std::vector<std::string> bad = {
      "", "<", "<a", "<a>", "<a></b>", "<a><b></a></b>", "<a x=1></a>", "<a x=\"1></a>", "<a>&bogus;</a>",
      "<a>&#0;</a>", "<a>&#xd800;</a>", "<a>&#99999999999;</a>", "<a>&amp</a>", "<!DOCTYPE a [<!ENTITY x \"y\">]><a/>",
      "<a/><b/>", "<a><![CDATA[x</a>", "<a><!-- x</a>", "</a>", "<>x</>", "<a></a>trailing",
      "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
      "<ListBucketResult><Contents><Key>k</Key><Size>99999999999999999999999</Size></Contents></ListBucketResult>",
      "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
      "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>", "<Other/>"};
  for (const std::string& doc : bad) {
    const Result<S3ListPage> page = parse_list_objects_v2(doc, "http://h/b?list-type=2");
    ASSERT_FALSE(page.ok()) << doc;
    EXPECT_EQ(page.status().code(), Code::kCorruption) << doc;
    EXPECT_NE(page.status().message().find("http://h/b?list-type=2"), std::string::npos) << page.status().message();
  }
}

TEST(S3Xml, DeepNestingIsRefusedNotOverflowed) {
  std::string doc;
  for (int i = 0; i < 100000; ++i) doc += "<a>";
  const Result<XmlElement> e = parse_xml(doc, "deep");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("nested deeper"), std::string::npos);
  std::string wide = "<a>";
  for (int i = 0; i < 200000; ++i) wide += "<b/>";
  wide += "</a>";
  EXPECT_FALSE(parse_xml(wide, "wide").ok());
}

}  // namespace
}  // namespace kvsnap
