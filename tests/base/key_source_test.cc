// base/key_source.h: key files (formats, permissions, what is not a file) and key commands
// (a good one, failing ones, a flood, one that hangs), on real files and a real /bin/sh.
#include "base/key_source.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

const std::string kHex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

KeyId want_id() {
  std::vector<uint8_t> k(32);
  for (size_t i = 0; i < k.size(); ++i) k[i] = uint8_t(i);
  return MasterKey::from_bytes(k).value().id();
}

class KeySource : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvsnap-key-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text, mode_t mode) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    EXPECT_EQ(::chmod(p.c_str(), mode), 0);
    return p.string();
  }
  fs::path dir_;
};

TEST_F(KeySource, KeyFileHexRawAndSymlink) {
  Result<MasterKey> k = load_key_file(write("hex.key", kHex + "\n", 0600));
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->id(), want_id());
  std::string raw(32, '\0');
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = char(i);
  k = load_key_file(write("raw.key", raw, 0400));
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->id(), want_id());
  // A mounted secret is a symbolic link to the file: the file's own mode is what counts.
  fs::create_symlink(dir_ / "hex.key", dir_ / "link.key");
  k = load_key_file((dir_ / "link.key").string());
  ASSERT_TRUE(k.ok()) << k.status().ToString();
}

TEST_F(KeySource, KeyFileOpenToOthersIsRefused) {
  for (mode_t mode : {0644, 0640, 0604, 0660, 0602, 0610}) {
    const std::string p = write("open.key", kHex, mode);
    Result<MasterKey> k = load_key_file(p);
    ASSERT_FALSE(k.ok()) << std::oct << mode;
    EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
    EXPECT_NE(k.status().message().find("chmod 600"), std::string::npos) << k.status().message();
    EXPECT_NE(k.status().message().find(p), std::string::npos) << k.status().message();
  }
}

// A FIFO is refused at once (its open waited for a writer), and a key file another user owns is
// refused as ssh refuses such a key (a review's finding: root took one).
TEST_F(KeySource, AFifoOrAnotherUsersKeyFileIsRefused) {
  const fs::path fifo = dir_ / "fifo.key";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result<MasterKey> k = load_key_file(fifo.string());
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("is not a regular file"), std::string::npos) << k.status().message();
  if (::geteuid() != 0) GTEST_SKIP() << "the ownership case needs root to chown a file to another user";
  const std::string theirs = write("theirs.key", kHex, 0600);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  k = load_key_file(theirs);
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("is owned by uid 65534, not by this user"), std::string::npos)
      << k.status().message();
}

TEST_F(KeySource, KeyFileRefusals) {
  Result<MasterKey> k = load_key_file((dir_ / "missing.key").string());
  EXPECT_EQ(k.status().code(), Code::kNotFound);
  k = load_key_file(dir_.string());
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("not a regular file"), std::string::npos);
  k = load_key_file(write("short.key", kHex.substr(2), 0600));
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("62 hex digits"), std::string::npos) << k.status().message();
  k = load_key_file(write("long.key", kHex + kHex, 0600));
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  std::string bad = kHex;
  bad[5] = 'z';
  k = load_key_file(write("bad.key", bad, 0600));
  EXPECT_NE(k.status().message().find("byte 5 is not a hex digit"), std::string::npos) << k.status().message();
  k = load_key_file(write("huge.key", std::string(5000, 'a'), 0600));
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("5000 bytes"), std::string::npos) << k.status().message();
  k = load_key_file(write("empty.key", "", 0600));
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
}

TEST_F(KeySource, KeyCommandPrintsTheKey) {
  Result<MasterKey> k = run_key_command("printf '%s\\n' " + kHex);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->id(), want_id());
  // What it writes to stderr is the user's to see; only stdout is the key.
  k = run_key_command("echo asking... >&2; cat " + write("k", kHex, 0644));
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->id(), want_id());
}

TEST_F(KeySource, KeyCommandFailures) {
  Result<MasterKey> k = run_key_command("echo " + kHex + "; exit 3");
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("failed (exit status 3)"), std::string::npos) << k.status().message();
  EXPECT_NE(k.status().message().find("key command 'echo' (its arguments not shown)"), std::string::npos)
      << k.status().message();
  EXPECT_EQ(k.status().message().find(kHex), std::string::npos) << "an argument may be a secret";
  k = run_key_command("kill -9 $$");
  EXPECT_NE(k.status().message().find("killed by signal 9"), std::string::npos) << k.status().message();
  k = run_key_command("/nonexistent/kvsnap-key-helper");
  EXPECT_NE(k.status().message().find("exit status 127"), std::string::npos) << k.status().message();
  // Nor an assignment before the program (a review's finding: 'VAULT_TOKEN=...' was shown as its name).
  k = run_key_command("KVSNAP_TEST_TOKEN=hvs.SECRET123 env -u X OTHER=hvs.SECRET456 sh -c 'exit 4'");
  EXPECT_NE(k.status().message().find("key command 'sh' (its arguments not shown) failed (exit status 4)"),
            std::string::npos) << k.status().message();
  EXPECT_EQ(k.status().message().find("SECRET"), std::string::npos) << k.status().message();
  // Nor part of a quoted assignment, which splitting on blanks took for the program (a review's
  // finding: 'hvs.SECRET789"' was shown).
  for (const std::string& cmd : {std::string("AUTH=\"Bearer hvs.SECRET789\" sh -c 'exit 5'"),
                                 std::string("AUTH='a hvs.SECRET789' sh -c 'exit 5'"),
                                 std::string("AUTH=a\\ hvs.SECRET789 sh -c 'exit 5'")}) {
    k = run_key_command(cmd);
    EXPECT_NE(k.status().message().find("key command (its words not shown) failed (exit status 5)"),
              std::string::npos) << cmd << ": " << k.status().message();
    EXPECT_EQ(k.status().message().find("SECRET"), std::string::npos) << k.status().message();
  }
  k = run_key_command("echo 1234");
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("4 hex digits"), std::string::npos) << k.status().message();
}

TEST_F(KeySource, KeyCommandFloodIsCutAndStopped) {
  // `yes` never ends on its own: the command must be stopped, not waited for.
  Result<MasterKey> k = run_key_command("yes " + kHex);
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("printed more than 4096 bytes"), std::string::npos) << k.status().message();
  KeyCommandOptions small;
  small.max_output = 65;
  k = run_key_command("printf '%s\\n\\n' " + kHex, small);
  EXPECT_NE(k.status().message().find("printed more than 65 bytes"), std::string::npos) << k.status().message();
}

TEST_F(KeySource, KeyCommandThatHangsIsKilled) {
  KeyCommandOptions quick;
  quick.timeout_ms = 200;
  Result<MasterKey> k = run_key_command("exec sleep 30", quick);
  EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
  EXPECT_NE(k.status().message().find("did not finish within 200 ms"), std::string::npos) << k.status().message();
  // Closing stdout does not count as finishing. (`exec`: the timeout stops the command kvsnap
  // started, not processes it left behind, which would hold ctest's output open.)
  k = run_key_command("echo " + kHex + "; exec >&-; exec sleep 30", quick);
  EXPECT_NE(k.status().message().find("did not finish"), std::string::npos) << k.status().message();
}

}  // namespace
}  // namespace kvsnap
