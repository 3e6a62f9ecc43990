// The PostgreSQL catalog's pure text helpers (no server): glob patterns as
// regular expressions, URLs without passwords.
#include <gtest/gtest.h>

#include "store/pg_catalog.h"
#include "store/pg_conn.h"

namespace kvsnap {
namespace {

TEST(PgText, GlobBecomesAnAnchoredRegex) {
  EXPECT_EQ(glob_to_regex("chat-*"), "^chat-.*$");
  EXPECT_EQ(glob_to_regex("a?c"), "^a.c$");
  EXPECT_EQ(glob_to_regex("v1.2+(x)"), "^v1\\.2\\+\\(x\\)$");
  EXPECT_EQ(glob_to_regex("[a-c]x"), "^[a-c]x$");
  EXPECT_EQ(glob_to_regex("[^0-9]*"), "^[^0-9].*$");
  EXPECT_EQ(glob_to_regex("[]]"), "^[]]$") << "a ']' first in a set is literal";
  EXPECT_EQ(glob_to_regex("a[b"), "^a\\[b$") << "an unclosed '[' is literal";
  EXPECT_EQ(glob_to_regex("[\\]"), "^[\\\\]$");
  // A review's finding: the only ']' of "[^]" is the set's first member, so the set never closes; the
  // loop looked for its end past the pattern's (ASan: a heap read overflow).
  EXPECT_EQ(glob_to_regex("[^]"), "^\\[\\^\\]$") << "an unclosed set is literal";
  EXPECT_EQ(glob_to_regex("[]"), "^\\[\\]$");
  EXPECT_EQ(glob_to_regex("x["), "^x\\[$");
  EXPECT_EQ(glob_to_regex("[^]]"), "^[^]]$");
  EXPECT_EQ(glob_to_regex("a[[]1]"), "^a[[]1\\]$") << "'[[]' is a literal '[', as in SQLite's GLOB";
}

TEST(PgText, UrlsLoseTheirPassword) {
  EXPECT_EQ(redact_pg_url("postgresql://kv:s3cret@db.example:5432/kvsnap"), "postgresql://kv@db.example:5432/kvsnap");
  EXPECT_EQ(redact_pg_url("postgresql://kv@127.0.0.1:5432/kvsnap"), "postgresql://kv@127.0.0.1:5432/kvsnap");
  EXPECT_EQ(redact_pg_url("postgresql://127.0.0.1:5432/kvsnap"), "postgresql://127.0.0.1:5432/kvsnap");
  EXPECT_EQ(redact_pg_url("postgresql://kv@h/db?password=x&sslmode=require"), "postgresql://kv@h/db?sslmode=require");
  EXPECT_EQ(redact_pg_url("postgresql://kv@h/db?sslmode=require&password=x"), "postgresql://kv@h/db?sslmode=require");
  EXPECT_EQ(redact_pg_url("host=h user=kv password=x dbname=d"), "host=h user=kv dbname=d");
  // A review's finding: a password with a raw '/' or '@' was printed whole, or in part.
  EXPECT_EQ(redact_pg_url("postgresql://kv:top/secret@127.0.0.1:1/db"), "postgresql://kv@127.0.0.1:1/db");
  EXPECT_EQ(redact_pg_url("postgresql://kv:p@ssword@127.0.0.1:1/db"), "postgresql://kv@127.0.0.1:1/db");
  EXPECT_EQ(redact_pg_url("postgresql://kv:pw@h/db?application_name=a@b"), "postgresql://kv@h/db?application_name=a@b");
  // A review's finding: a '?' in the password was taken for the query's start, and nothing was hidden.
  EXPECT_EQ(redact_pg_url("postgresql://kv:Sup3r?Secr3t@127.0.0.1:1/kvsnap"), "postgresql://kv@127.0.0.1:1/kvsnap");
  EXPECT_EQ(redact_pg_url("postgresql://kv:pa?ss/x@h/db"), "postgresql://kv@h/db");
}

// libpq quotes what it cannot parse ("invalid percent-encoded token: \"Se%ZZcret\""): the password,
// as written and decoded, never reaches a message (a review's finding).
TEST(PgText, LibpqMessagesLoseThePassword) {
  EXPECT_EQ(without_pg_secrets("invalid percent-encoded token: \"Se%ZZcret\"", "postgresql://kv:Se%ZZcret@h/db"),
            "invalid percent-encoded token: \"***\"");
  EXPECT_EQ(without_pg_secrets("bad: a@b and a%40b", "postgresql://kv:a%40b@h/db"), "bad: *** and ***");
  EXPECT_EQ(without_pg_secrets("token \"Se%ZZ\"", "postgresql://kv@h/db?sslmode=require&password=Se%ZZ"), "token \"***\"");
  EXPECT_EQ(without_pg_secrets("no password here", "postgresql://kv@h/db"), "no password here");
  // A password the mask holds ends (it matched the mask for ever).
  EXPECT_EQ(without_pg_secrets("pw * here", "postgresql://kv:*@h/db"), "pw *** here");
  EXPECT_EQ(without_pg_secrets("pw * here", "postgresql://kv:%2A@h/db"), "pw *** here");
}

}  // namespace
}  // namespace kvsnap
