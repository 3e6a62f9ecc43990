// kvsnap migrate DIR as a user runs it: in place, atomic per file, resumable
// after kill -9, confined to DIR.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/json.h"
#include "test_files.h"

namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) { return kvsnap::test::slurp_text(p); }

fs::path fixture(const std::string& n) { return fs::path(KVSNAP_SOURCE_DIR) / "fixtures" / n; }
const std::string kModel = fixture("models/tiny-hd64.gguf").string();

int sh(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("kvsnap-migrate-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// DIR/slots holding copies of fixtures, named as given.
fs::path slots_with(const TempDir& t, const std::vector<std::pair<std::string, std::string>>& files) {
  const fs::path dir = t.path / "slots";
  fs::create_directories(dir);
  for (const auto& [from, name] : files) fs::copy_file(fixture(from), dir / name);
  return dir;
}

// The same, each copy without a token twice: layer 0's RoPE then tells nothing about how an
// old-format quantized file was stored (test_files.h), and only a build or a declaration does.
fs::path unwitnessed_slots_with(const TempDir& t, const std::vector<std::pair<std::string, std::string>>& files) {
  const fs::path dir = t.path / "slots";
  fs::create_directories(dir);
  for (const auto& [from, name] : files) EXPECT_TRUE(kvsnap::test::copy_without_repeated_tokens(fixture(from), dir / name));
  return dir;
}

// What kvsnap convert makes of `src` with the same request: the one valid converted file.
std::string expected_conversion(const fs::path& src, const fs::path& work, const std::string& args) {
  fs::path out = work / "expected.bin";
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " convert " + src.string() + " " + out.string() + " " + args +
               " >/dev/null"),
            0);
  std::string b = slurp(out);
  fs::remove(out);
  return b;
}

// A typo in a flag fails once, before anything: no store created for --backup-store, no file
// touched (the run exited 0 on a directory without state files, and failed file by file on others).
TEST(Migrate, ABadFlagFailsBeforeTheStoreOrAnyFile) {
  TempDir t;
  const fs::path dir = slots_with(t, {{"v0.5.0/hd64-f16-f16-faon.slot", "a.slot"}});
  const std::string before = slurp(dir / "a.slot");
  const fs::path store = t.path / "new-store", err = t.path / "err.txt";
  for (const std::string flags : {"--ctk q9_9", "--fa maybe", "--format bogus", "--rotation sideways", "-j 0",
                                  "-j 100000", "-t 257", "--target-build tomorrow"}) {
    SCOPED_TRACE(flags);
    EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + flags + " --backup-store --store " +
                 store.string() + " 2>" + err.string()),
              2)
        << slurp(err);
    EXPECT_FALSE(fs::exists(store)) << "created the store";
    EXPECT_EQ(slurp(dir / "a.slot"), before);
  }
}

// A downgrade for --target-build b8121 writes ggsq v2, whose rotation the header does not show:
// rerun after an interruption, the converted files are ambiguous, and the refusal names the way
// out (the target build as their source build), which then finishes the run.
TEST(Migrate, ARerunOfADowngradeNamesTheBuildThatFinishesIt) {
  TempDir t;
  const fs::path dir = unwitnessed_slots_with(t, {{"v0.5.0/hd64-q8_0-q8_0-faon.slot", "a.slot"}});
  const std::string run = std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " -q --model " + kModel +
                          " --target-build b8121";
  ASSERT_EQ(sh(run + " >/dev/null"), 0);
  // not reached before a kill
  ASSERT_TRUE(kvsnap::test::copy_without_repeated_tokens(fixture("v0.5.0/hd64-q8_0-q8_0-faon.slot"), dir / "b.slot"));
  const fs::path err = t.path / "err.txt";
  EXPECT_EQ(sh(run + " >/dev/null 2>" + err.string()), 6);
  EXPECT_NE(slurp(err).find("If an earlier, interrupted run of this migrate wrote it (--target-build b8121 writes "
                            "this format), it is that build's: add --source-build b8121"),
            std::string::npos)
      << slurp(err);
  EXPECT_EQ(sh(run + " --source-build b8121 >/dev/null 2>" + err.string()), 0) << slurp(err);
}

TEST(Migrate, ConvertsInPlaceExactlyLikeConvertAndSkipsWhatIsDone) {
  TempDir t;
  fs::path dir = t.path / "slots";
  fs::create_directories(dir);
  const std::string args = "--ctk q8_0 --ctv q4_0 --fa on --model " + kModel;
  std::vector<std::string> names = {"b8121/hd64-f16-f16-faoff.slot", "v0.5.0/hd64-f16-f16-faon.slot",
                                    "b5640/hd64-f16-f16-faon.slot", "v0.5.0/hd64-q8_0-q8_0-faon.slot"};
  std::vector<std::string> want;
  for (size_t i = 0; i < names.size(); ++i) {
    fs::copy_file(fixture(names[i]), dir / ("s" + std::to_string(i) + ".bin"));
    want.push_back(expected_conversion(fixture(names[i]), t.path, args));
  }
  const std::string before = slurp(dir / "s0.bin");
  fs::permissions(dir / "s0.bin", fs::perms::owner_read | fs::perms::owner_write);  // a private conversation
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --dry-run " + args + " >/dev/null"), 0);
  EXPECT_EQ(slurp(dir / "s0.bin"), before) << "--dry-run changed a file";
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " >/dev/null"), 0);
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(slurp(dir / ("s" + std::to_string(i) + ".bin")), want[i]) << i;
  EXPECT_EQ(fs::status(dir / "s0.bin").permissions(), fs::perms::owner_read | fs::perms::owner_write)
      << "the converted file is readable by others";
  // a second run finds everything at the target
  const std::string again = t.path / "again.json";
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --json " + args + " >" + again), 0);
  EXPECT_NE(slurp(again).find("\"at_target\": 4"), std::string::npos) << slurp(again);
}

// A file whose header, types and layout are the target's is not yet at the target when a build
// of that version writes other bytes around its tensors: b8121's v9 sessions hold outputs and
// b8390's do not; b5640's ggsq v2 cells hold their seq id and b3543's do not. Each was reported
// "at target", exit 0, left as it was for a build that cannot load it; now each becomes what
// `kvsnap convert` writes, and a rerun finds it at the target.
TEST(Migrate, AFileIsAtTheTargetOnlyWhenItIsWhatItsConversionWrites) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"b8121/hd64-f16-f16-faon.session", "--target-build b8390"},
      {"b8390/hd64-f16-f16-faon.session", "--target-build b8121"},
      {"b5640/hd64-f16-f16-faon.slot", "--format ggsq-v2-b3543"},
      {"b5640/hd64-f16-f16-faon.slot", "--target-build b3543"},
  };
  for (const auto& [file, target] : cases) {
    TempDir t;
    const fs::path dir = slots_with(t, {{file, "s.bin"}});
    const std::string args = target + " --model " + kModel;
    const std::string want = expected_conversion(fixture(file), t.path, args);
    ASSERT_FALSE(want.empty()) << file << " " << target;
    ASSERT_NE(want, slurp(fixture(file))) << file << " " << target << ": converts to itself, this case proves nothing";
    const std::string json = (t.path / "out.json").string();
    ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " --json >" + json), 0);
    EXPECT_NE(slurp(json).find("\"converted\": 1"), std::string::npos) << file << " " << target << slurp(json);
    EXPECT_TRUE(slurp(dir / "s.bin") == want) << file << " " << target << ": not what convert writes";
    ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " --json >" + json), 0);
    EXPECT_NE(slurp(json).find("\"at_target\": 1"), std::string::npos) << file << " " << target << slurp(json);
  }
}

// JSON holds text: a file name that is not UTF-8 showed as U+FFFD, two such names alike (a review's
// finding). Its bytes come in hex beside it.
TEST(Migrate, AFileNameThatIsNotUtf8IsGivenInHexToo) {
  TempDir t;
  const fs::path dir = slots_with(t, {{"v0.5.0/hd64-f16-f16-faon.slot", "a\xff.slot"}});
  const std::string json = (t.path / "out.json").string();
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --ctk f32 --ctv f32 --dry-run --json >" +
               json),
            0)
      << slurp(json);
  const auto j = nlohmann::json::parse(slurp(json));
  ASSERT_EQ(j["files"].size(), 1u) << j.dump();
  EXPECT_EQ(j["files"][0]["file_hex"], "61ff2e736c6f74") << j.dump();
}

// The rotation's remedy names what migrate takes: --model, not convert's --head-dim-k/--head-dim-v
// (which migrate refuses as unknown options), in the file's line and in the error line.
TEST(Migrate, ARemedyNamesOnlyOptionsMigrateTakes) {
  TempDir t;
  const fs::path dir = slots_with(t, {{"v0.5.0/hd64-f16-f16-faon.slot", "a.slot"}});
  const std::string said = (t.path / "said.txt").string();
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --ctk q8_0 --ctv q8_0 -q >" + said + " 2>&1"), 2);
  const std::string text = slurp(said);
  EXPECT_NE(text.find("pass the model with --model GGUF"), std::string::npos) << text;
  EXPECT_EQ(text.find("head-dim"), std::string::npos) << text;
  EXPECT_NE(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --head-dim-k 64 >/dev/null 2>&1"), 0)
      << "migrate takes --head-dim-k: then its remedy may name it";
}

// A slot directory of a llama.cpp that wrote ggsq v2: its quantized files do not say whether that
// build rotated. Layer 0's RoPE does when the prompt repeats tokens: b10361's (rotated) and
// b8121's (not) convert without a build named, exactly as `kvsnap convert --source-build` does.
TEST(Migrate, OldQuantizedFilesAreReadByTheirRope) {
  TempDir t;
  const fs::path dir = slots_with(t, {{"b10361/hd64-q8_0-q8_0-faon.slot", "g.slot"}, {"b8121/hd64-q8_0-q8_0-faon.slot", "d.slot"}});
  const std::string args = "--ctk f16 --ctv f16 --model " + kModel;
  const std::string want_g = expected_conversion(fixture("b10361/hd64-q8_0-q8_0-faon.slot"), t.path, args + " --source-build b10361");
  const std::string want_d = expected_conversion(fixture("b8121/hd64-q8_0-q8_0-faon.slot"), t.path, args + " --source-build b8121");
  ASSERT_FALSE(want_g.empty());
  ASSERT_NE(want_g, want_d);
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " >/dev/null"), 0);
  EXPECT_EQ(slurp(dir / "g.slot"), want_g);
  EXPECT_EQ(slurp(dir / "d.slot"), want_d);
}

// Without repeated tokens nothing in the data tells: without --source-build they are left as they
// are and the run fails; with it they convert exactly as `kvsnap convert --source-build` does.
TEST(Migrate, OldQuantizedFilesNeedTheBuildThatWroteThem) {
  TempDir t;
  const fs::path dir = unwitnessed_slots_with(t, {{"b10361/hd64-q8_0-q8_0-faon.slot", "g.slot"},
                                                  {"b10361/hd64-f16-f16-faon.slot", "f.slot"}});
  const std::string before = slurp(dir / "g.slot");
  const std::string args = "--ctk f16 --ctv f16 --model " + kModel;
  EXPECT_NE(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " >/dev/null 2>&1"), 0);
  EXPECT_EQ(slurp(dir / "g.slot"), before) << "converted on a guess";
  fs::copy_file(dir / "g.slot", t.path / "g-original.slot");
  const std::string want = expected_conversion(t.path / "g-original.slot", t.path, args + " --source-build b10361");
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " --source-build b10361 >/dev/null"),
            0);
  EXPECT_EQ(slurp(dir / "g.slot"), want);
}

// --src-rotation names how the old-format files are stored (a review's finding: it was applied to
// current-format files too). In a directory of b8121 (unrotated) and v0.5.0 (rotated) q8_0 files,
// `--src-rotation off` converts the old file as `kvsnap convert` does and refuses the current-format
// one (exit 6, untouched), where it read its rotated values as unrotated (exit 0); without the flag
// that one then converts as convert does. And a rerun for another target with the same flag never
// reads what the first run wrote (ggsq v3, rotated) as unrotated.
TEST(Migrate, SrcRotationDescribesTheOldFilesOnly) {
  TempDir t;
  const fs::path dir = slots_with(t, {{"b8121/hd64-q8_0-q8_0-faon.slot", "old.slot"}, {"v0.5.0/hd64-q8_0-q8_0-faon.slot", "new.slot"}});
  const std::string args = "--ctk f16 --ctv f16 --model " + kModel;
  const std::string want_old = expected_conversion(fixture("b8121/hd64-q8_0-q8_0-faon.slot"), t.path, args + " --src-rotation off");
  const std::string want_new = expected_conversion(fixture("v0.5.0/hd64-q8_0-q8_0-faon.slot"), t.path, args);
  const std::string before = slurp(dir / "new.slot");
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " --src-rotation off >/dev/null 2>&1"), 6);
  EXPECT_EQ(slurp(dir / "old.slot"), want_old);
  EXPECT_EQ(slurp(dir / "new.slot"), before) << "a current-format file read as unrotated";
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " >/dev/null"), 0);
  EXPECT_EQ(slurp(dir / "new.slot"), want_new);
  EXPECT_EQ(slurp(dir / "old.slot"), want_old);

  // the resumed run: to q8_0 (the old file rotated into ggsq v3), then to f16 with the same flag
  TempDir t2;
  const fs::path dir2 = slots_with(t2, {{"b8121/hd64-q8_0-q8_0-faon.slot", "old.slot"}});
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir2.string() + " --model " + kModel +
               " --src-rotation off >/dev/null"),
            0);
  const std::string upgraded = slurp(dir2 / "old.slot");
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir2.string() + " " + args + " --src-rotation off >/dev/null 2>&1"), 6);
  EXPECT_EQ(slurp(dir2 / "old.slot"), upgraded);
}

// q8_0 files of b8121 (not rotated) for b8700 (rotated): the values must be rotated, the header
// stays ggsq v2 q8_0. Converted in place, a rerun could not tell them from originals and would
// rotate them twice, so migrate refuses them (exit 4, the file untouched) and still takes the
// files whose header shows the change; `kvsnap convert` into another file does the rotation.
TEST(Migrate, RefusesWhatOnlyRotatesValuesUnderTheSameHeader) {
  TempDir t;
  const fs::path dir = slots_with(t, {{"b8121/hd64-q8_0-q8_0-faon.slot", "q.slot"}, {"b8121/hd64-f16-f16-faon.slot", "f.slot"}});
  const std::string before = slurp(dir / "q.slot");
  const std::string args = "--source-build b8121 --target-build b8700 --model " + kModel;
  const std::string rotated = expected_conversion(fixture("b8121/hd64-q8_0-q8_0-faon.slot"), t.path, args);
  ASSERT_FALSE(rotated.empty());
  ASSERT_NE(rotated, before) << "the fixture's conversion does not rotate: this test proves nothing";
  const std::string err = (t.path / "err.txt").string();
  for (const std::string extra : {" --dry-run", ""}) {
    EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + extra + " >/dev/null 2>" + err),
              4)
        << extra;
    EXPECT_NE(slurp(err).find("q.slot: its quantized K/V must be Hadamard-rotated"), std::string::npos) << slurp(err);
    EXPECT_EQ(slurp(dir / "q.slot"), before) << "rotated in place" << extra;
  }
}

// f16 files of b8121 for b8700 at q8_0: the output is ggsq v2 like the originals, its q8_0 rotated,
// which b8121's q8_0 is not. A rerun with the same --source-build (a resumed run, or one to other
// types) would read it as b8121 wrote it and decode it unrotated: a silently wrong cache. So
// migrate refuses it in place (exit 4, the file untouched); `kvsnap convert` into another file does it.
TEST(Migrate, RefusesARotatedOutputWhoseHeaderLooksLikeAnOriginal) {
  TempDir t;
  const fs::path dir = slots_with(t, {{"b8121/hd64-f16-f16-faon.slot", "f.slot"}});
  const std::string before = slurp(dir / "f.slot");
  const std::string args = "--source-build b8121 --target-build b8700 --ctk q8_0 --ctv q8_0 --model " + kModel;
  const std::string converted = expected_conversion(fixture("b8121/hd64-f16-f16-faon.slot"), t.path, args);
  ASSERT_FALSE(converted.empty()) << "kvsnap convert does it into another file";
  const std::string err = (t.path / "err.txt").string();
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " >/dev/null 2>" + err), 4)
      << slurp(err);
  EXPECT_NE(slurp(err).find("whose header does not show the rotation"), std::string::npos) << slurp(err);
  EXPECT_EQ(slurp(dir / "f.slot"), before) << "converted in place";
  // To a build that does not rotate, the same conversion is what the header shows: done.
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() +
               " --source-build b8121 --target-build b8121 --ctk q8_0 --ctv q8_0 --model " + kModel + " >/dev/null"),
            0);
  EXPECT_NE(slurp(dir / "f.slot"), before);
}

// An old-format file upgraded in place without --model: v0.5.0 files of an M-RoPE model hold a
// cell extra the old file lacks, and nothing in the file says whether the model is one, so the
// upgrade is refused (exit 6, the file untouched; `kvsnap convert` notes the assumption instead).
TEST(Migrate, AnUpgradeWithoutTheModelIsRefused) {
  TempDir t;
  const fs::path dir = slots_with(t, {{"b8121/hd64-f16-f16-faon.slot", "f.slot"}});
  const std::string before = slurp(dir / "f.slot");
  const std::string err = (t.path / "err.txt").string();
  for (const std::string extra : {" --dry-run", ""}) {
    EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + extra + " >/dev/null 2>" + err), 6) << extra;
    EXPECT_NE(slurp(err).find("needs the model"), std::string::npos) << slurp(err);
    EXPECT_NE(slurp(err).find("--model GGUF"), std::string::npos) << slurp(err);
    EXPECT_EQ(slurp(dir / "f.slot"), before) << extra;
  }
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --model " + kModel + " >/dev/null"), 0);
  EXPECT_NE(slurp(dir / "f.slot"), before) << "with the model the upgrade is done";
}

// A slot file a killed `kvsnap save --server` left behind (its name: server_flows.cc's
// fresh_name, a temporary of a process that is gone) is removed, never converted as a slot; a
// temporary of a live process is left alone. So is restore --server's slot file while it is being
// written (SlotFileWriter's temporary of that name: the last pid decides).
TEST(Migrate, RemovesWhatAKilledServerSaveLeftAndNothingOfALiveOne) {
  TempDir t;
  fs::path dir = t.path / "slots";
  fs::create_directories(dir);
  pid_t dead = ::fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const std::string left = "kvsnap-save.kvsnap-tmp-" + std::to_string(dead) + "-77.bin";
  const std::string live = "kvsnap-restore.kvsnap-tmp-" + std::to_string(::getpid()) + "-78.bin";
  const std::string me = std::to_string(::getpid()), gone = std::to_string(dead);
  const std::string left_writing = "kvsnap-restore.kvsnap-tmp-" + gone + "-79.bin.kvsnap-tmp-" + gone + "-80";
  const std::string live_writing = "kvsnap-restore.kvsnap-tmp-" + me + "-81.bin.kvsnap-tmp-" + me + "-82";
  for (const std::string& name : {left, live, left_writing, live_writing, std::string("slot.bin")}) {
    fs::copy_file(fixture("v0.5.0/hd64-f16-f16-faon.slot"), dir / name);
  }
  const std::string json = (t.path / "out.json").string();
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --ctk f32 --ctv f32 --json >" + json), 0);
  EXPECT_FALSE(fs::exists(dir / left));
  EXPECT_FALSE(fs::exists(dir / left_writing)) << "a dead restore's slot file kept";
  EXPECT_EQ(slurp(dir / live), slurp(fixture("v0.5.0/hd64-f16-f16-faon.slot")));
  EXPECT_EQ(slurp(dir / live_writing), slurp(fixture("v0.5.0/hd64-f16-f16-faon.slot"))) << "a live restore's file converted";
  EXPECT_NE(slurp(json).find("\"converted\": 1"), std::string::npos) << slurp(json);
  // The removed ones by name (a file someone named like a temporary goes as one, and is said).
  const auto j = nlohmann::json::parse(slurp(json), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.contains("stale_temp_names")) << slurp(json);
  EXPECT_EQ(j["stale_temp_names"].size(), 2u) << j["stale_temp_names"].dump();
  EXPECT_NE(j["stale_temp_names"].dump().find(left), std::string::npos) << j["stale_temp_names"].dump();
  // And in the summary a user reads.
  const std::string named = "x.kvsnap-tmp-" + gone + "-5";
  fs::copy_file(fixture("v0.5.0/hd64-f16-f16-faon.slot"), dir / named);
  const std::string text = (t.path / "out.txt").string();
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --ctk f32 --ctv f32 >" + text), 0);
  EXPECT_NE(slurp(text).find("removed 1 stale temporary files (left by a kvsnap that was killed): '" + named + "'"),
            std::string::npos) << slurp(text);
}

// The command prefix that runs kvsnap as user 65534 (setpriv), or "" with `why_not` said: not root,
// no setpriv, or a build that user cannot reach.
std::string as_nobody_prefix(std::string& why_not) {
  const std::string as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  if (::geteuid() != 0) why_not = "needs root (to run kvsnap as another user)";
  else if (sh("command -v setpriv >/dev/null") != 0) why_not = "no setpriv";
  else if (sh(as_nobody + std::string(KVSNAP_BINARY) + " --version >/dev/null 2>&1") != 0)
    why_not = std::string("user 65534 cannot run ") + KVSNAP_BINARY + " (a checkout only root can reach)";
  return why_not.empty() ? as_nobody : "";
}

// A review's finding: run as one user over the slot files of another (a group-writable
// directory), migrate converted them, exit 0, and each conversion, a new file, was kvsnap's user's:
// the server's user could no longer save over it (or read it, mode 0640). Such a file is refused
// (exit 7) and left as it is; its owner's run converts it. Needs root, to be two users.
TEST(Migrate, AFileOfAnotherUserIsRefusedUnlessRunAsRoot) {
  std::string why_not;
  const std::string as_nobody = as_nobody_prefix(why_not);
  if (as_nobody.empty()) GTEST_SKIP() << why_not;
  TempDir t;
  fs::permissions(t.path, fs::perms::all);
  const fs::path dir = slots_with(t, {{"v0.5.0/hd64-f16-f16-faon.slot", "a.slot"}});
  fs::permissions(dir, fs::perms::all);  // anyone may make and rename files here
  fs::permissions(dir / "a.slot", fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                                      fs::perms::others_read | fs::perms::others_write);
  const std::string original = slurp(dir / "a.slot");
  const fs::path out = t.path / "out.txt";
  const std::string run = std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --ctk f32 --ctv f32 >" +
                          out.string() + " 2>&1";
  EXPECT_EQ(sh(as_nobody + run), 7) << slurp(out);
  EXPECT_NE(slurp(out).find("owned by user id 0, not by kvsnap's user"), std::string::npos) << slurp(out);
  EXPECT_EQ(slurp(dir / "a.slot"), original) << "converted over its owner";
  struct stat st {};
  ASSERT_EQ(::stat((dir / "a.slot").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  // Its owner's run (here root, which keeps each file's owner) converts it.
  EXPECT_EQ(sh(run), 0) << slurp(out);
  EXPECT_NE(slurp(dir / "a.slot"), original);
}

// A review's finding: run over a directory it cannot create files in (its own files in a directory of
// another user's, mode 0755), migrate stored each file's backup, then failed each conversion. Now the
// directory is probed once first: exit 7, nothing converted, no backup stored, the files as they were.
TEST(Migrate, ADirectoryItCannotWriteIntoIsRefusedBeforeAnyBackup) {
  std::string why_not;
  const std::string as_nobody = as_nobody_prefix(why_not);
  if (as_nobody.empty()) GTEST_SKIP() << why_not;
  TempDir t;
  fs::permissions(t.path, fs::perms::all);
  const fs::path dir = slots_with(t, {{"v0.5.0/hd64-f16-f16-faon.slot", "a.slot"}});
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                           fs::perms::others_read | fs::perms::others_exec);
  ASSERT_EQ(::chown((dir / "a.slot").c_str(), 65534, 65534), 0);  // nobody's file, root's directory
  const std::string original = slurp(dir / "a.slot");
  const fs::path out = t.path / "out.txt", store = t.path / "backups", listed = t.path / "ls.json";
  const std::string run = as_nobody + std::string(KVSNAP_BINARY) + " migrate " + dir.string() +
                          " --ctk f32 --ctv f32 --backup-store --store " + store.string() + " >" + out.string() +
                          " 2>&1";
  EXPECT_EQ(sh(run), 7) << slurp(out);  // an I/O error
  EXPECT_NE(slurp(out).find("kvsnap cannot create files there"), std::string::npos) << slurp(out);
  EXPECT_NE(slurp(out).find("no backup stored"), std::string::npos) << slurp(out);
  EXPECT_EQ(slurp(dir / "a.slot"), original);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"a.slot"}) << "a temporary or lock file left behind";
  if (fs::exists(store)) {
    ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " ls --store " + store.string() + " --json >" + listed.string()), 0);
    EXPECT_EQ(nlohmann::json::parse(slurp(listed), nullptr, false), nlohmann::json::array()) << "a backup was stored";
  }
}

TEST(Migrate, BackupStoreKeepsEveryOriginal) {
  TempDir t;
  fs::path dir = t.path / "slots", store = t.path / "store";
  fs::create_directories(dir);
  fs::copy_file(fixture("b8121/hd64-f16-f16-faon.slot"), dir / "a.slot");
  fs::copy_file(fixture("v0.5.0/hd64-f16-f16-faoff.slot"), dir / "b.slot");
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --backup-store --store " + store.string() +
               " --ctk q8_0 --ctv q8_0 --fa on -m " + kModel + " >/dev/null"),
            0);
  const std::string k = std::string(KVSNAP_BINARY) + " ";
  for (const auto& [id, orig] : {std::pair{"1", "b8121/hd64-f16-f16-faon.slot"}, {"2", "v0.5.0/hd64-f16-f16-faoff.slot"}}) {
    const fs::path back = t.path / (std::string("back-") + id);
    ASSERT_EQ(sh(k + "restore " + id + " -o " + back.string() + " --store " + store.string() + " >/dev/null"), 0);
    EXPECT_EQ(slurp(back), slurp(fixture(orig))) << id;
  }
}

// `kvsnap migrate DIR --backup-store --store STORE ARGS --json`'s exit status and its JSON (null
// when it printed none).
struct MigrateRun {
  int code = -1;
  nlohmann::json out;
};
MigrateRun migrate_backing_up(const fs::path& dir, const fs::path& store, const std::string& args,
                              const fs::path& scratch) {
  const fs::path json = scratch / "migrate.json";
  MigrateRun r;
  r.code = sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --backup-store --store " + store.string() +
              " " + args + " --json >" + json.string());
  r.out = nlohmann::json::parse(slurp(json), nullptr, /*allow_exceptions=*/false);
  return r;
}

// The snapshots backing up `file` (tag migrated-from=FILE) in `store`, as `kvsnap ls --json` lists them.
nlohmann::json backups_of(const fs::path& file, const fs::path& store, const fs::path& scratch) {
  const fs::path found = scratch / "ls.json";
  const int rc = sh(std::string(KVSNAP_BINARY) + " ls --json --tag migrated-from=" + file.string() + " --store " +
                    store.string() + " >" + found.string());
  nlohmann::json rows = nlohmann::json::parse(slurp(found), nullptr, /*allow_exceptions=*/false);
  if (rc == 0 && rows.is_array()) return rows;
  ADD_FAILURE() << "kvsnap ls exited " << rc << ": " << slurp(found);
  return nlohmann::json::array();
}

// The bytes `kvsnap restore ID -o ...` writes from `store` ("" when it fails).
std::string restored_backup(int64_t id, const fs::path& store, const fs::path& scratch) {
  const fs::path back = scratch / "back.slot";
  fs::remove(back);
  const int rc = sh(std::string(KVSNAP_BINARY) + " restore " + std::to_string(id) + " -o " + back.string() +
                    " --store " + store.string() + " >/dev/null");
  if (rc == 0) return slurp(back);
  ADD_FAILURE() << "kvsnap restore " << id << " exited " << rc;
  return "";
}

// A store held to a cap it cannot meet: the backups are pinned, so the second file's backup does not
// evict the first's (whose original was converted in place: its only copy); what they evicted (an
// older, unpinned snapshot) and the cap's warning are listed.
TEST(Migrate, BackupsInACappedStoreAreNeverEvicted) {
  TempDir t;
  fs::path dir = t.path / "slots", store = t.path / "store";
  fs::create_directories(dir);
  fs::create_directories(store);
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " save " + fixture("v0.5.0/hd64-q8_0-q8_0-faon.slot").string() +
               " --name older --store " + store.string() + " >/dev/null"),
            0);
  std::ofstream(store / "store.json") << R"({"max_bytes": 1})";
  fs::copy_file(fixture("b8121/hd64-f16-f16-faon.slot"), dir / "a.slot");
  fs::copy_file(fixture("v0.5.0/hd64-f16-f16-faoff.slot"), dir / "b.slot");
  const MigrateRun run = migrate_backing_up(dir, store, "--ctk q8_0 --ctv q8_0 --fa on -m " + kModel, t.path);
  ASSERT_EQ(run.code, 0);
  const nlohmann::json& j = run.out;
  ASSERT_EQ(j["backup_evicted"].size(), 1u) << j.dump();
  EXPECT_EQ(j["backup_evicted"][0]["snapshot"]["name"], "older") << j.dump();
  ASSERT_FALSE(j["backup_warnings"].empty()) << j.dump();
  EXPECT_NE(std::string(j["backup_warnings"][0]).find("cap not met"), std::string::npos) << j.dump();
  for (const auto& [name, orig] : {std::pair{"a.slot", "b8121/hd64-f16-f16-faon.slot"},
                                   {"b.slot", "v0.5.0/hd64-f16-f16-faoff.slot"}}) {
    const nlohmann::json rows = backups_of(dir / name, store, t.path);
    ASSERT_EQ(rows.size(), 1u) << name << "'s backup was evicted: " << rows.dump();
    EXPECT_EQ(restored_backup(int64_t(rows[0]["id"]), store, t.path), slurp(fixture(orig))) << name;
  }
}

// A killed run left a pinned backup of a file it had not converted yet: the rerun's backup of the
// same bytes replaces it (one pinned backup per original, not one per run).
TEST(Migrate, ARerunReplacesAnEarlierBackupOfTheSameBytes) {
  TempDir t;
  fs::path dir = t.path / "slots", store = t.path / "store";
  fs::create_directories(dir);
  fs::copy_file(fixture("v0.5.0/hd64-f16-f16-faoff.slot"), dir / "b.slot");
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " save " + (dir / "b.slot").string() + " --pin --tag migrated-from=" +
               (dir / "b.slot").string() + " --store " + store.string() + " >/dev/null"),
            0);
  const MigrateRun run = migrate_backing_up(dir, store, "--ctk q8_0 --ctv q8_0 --fa on -m " + kModel, t.path);
  ASSERT_EQ(run.code, 0);
  EXPECT_EQ(run.out["backup_replaced"].size(), 1u) << run.out.dump();
  const nlohmann::json rows = backups_of(dir / "b.slot", store, t.path);
  ASSERT_EQ(rows.size(), 1u) << "one backup of b.slot: " << rows.dump();
  EXPECT_TRUE(bool(rows[0]["pinned"]));
  EXPECT_EQ(restored_backup(int64_t(rows[0]["id"]), store, t.path), slurp(fixture("v0.5.0/hd64-f16-f16-faoff.slot")));
}

TEST(Migrate, NeverFollowsSymlinksOutOfTheDirectory) {
  TempDir t;
  fs::path dir = t.path / "slots", outside = t.path / "outside.slot";
  fs::create_directories(dir);
  fs::copy_file(fixture("v0.5.0/hd64-f16-f16-faon.slot"), outside);
  fs::create_symlink(outside, dir / "link.slot");
  const std::string before = slurp(outside);
  ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " --ctk q8_0 --ctv q8_0 -m " + kModel +
               " >/dev/null"),
            0);
  EXPECT_EQ(slurp(outside), before);
  EXPECT_TRUE(fs::is_symlink(dir / "link.slot"));
}

TEST(Migrate, DamagedStateFailsTheRunButNotTheOthers) {
  TempDir t;
  fs::copy_file(fixture("v0.5.0/hd64-f16-f16-faon.slot"), t.path / "good.slot");
  std::string b = slurp(fixture("v0.5.0/hd64-f16-f16-faon.slot"));
  std::ofstream(t.path / "cut.slot", std::ios::binary) << b.substr(0, b.size() / 2);
  std::ofstream(t.path / "readme.txt") << "not a state";
  // the exit status is the damaged file's, as convert would exit for it: 3 (corrupt), not a blanket 5
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + t.path.string() + " --ctk q8_0 --ctv q8_0 -m " + kModel +
               " >/dev/null 2>" + (t.path / "err").string()),
            3);
  EXPECT_NE(slurp(t.path / "err").find("1 of the files in " + t.path.string() + " failed (listed above); the first, cut.slot"),
            std::string::npos)
      << slurp(t.path / "err");
  EXPECT_NE(slurp(t.path / "good.slot"), b) << "the good file was not converted";
  EXPECT_EQ(slurp(t.path / "cut.slot"), b.substr(0, b.size() / 2));
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + (t.path / "missing").string() + " 2>/dev/null"), 8);
}

// A file of another model fails as convert fails on it (exit 5, mismatch); with a damaged file before it
// in name order, the damaged one's status (3) is the run's.
TEST(Migrate, ExitStatusIsTheFirstFailedFilesCause) {
  TempDir t;
  fs::copy_file(fixture("b10361/hd96-q8_0-q8_0-faon.slot"), t.path / "b-other-model.slot");
  const std::string cmd = std::string(KVSNAP_BINARY) + " migrate " + t.path.string() + " --ctk q8_0 --ctv q8_0 -m " +
                          kModel + " >/dev/null 2>&1";
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " convert " + (t.path / "b-other-model.slot").string() + " " +
               (t.path / "x.out").string() + " --ctk q8_0 --ctv q8_0 -m " + kModel + " >/dev/null 2>&1"),
            5);
  EXPECT_EQ(sh(cmd), 5);
  // the per-file listing names the remedy as the flag it is, as the error line does
  EXPECT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + t.path.string() + " --ctk q8_0 --ctv q8_0 -m " + kModel +
               " >" + (t.path / "out").string() + " 2>&1"),
            5);
  const std::string said = slurp(t.path / "out");
  fs::remove(t.path / "out");
  EXPECT_NE(said.find("b-other-model.slot: FAILED"), std::string::npos) << said;
  EXPECT_NE(said.find("(--model GGUF)"), std::string::npos) << said;
  EXPECT_EQ(said.find("{--"), std::string::npos) << said;
  std::string b = slurp(fixture("v0.5.0/hd64-f16-f16-faon.slot"));
  std::ofstream(t.path / "a-cut.slot", std::ios::binary) << b.substr(0, b.size() / 2);
  EXPECT_EQ(sh(cmd), 3);
}

// 100 files, kill -9 at random moments, then run again: every file is at all
// times either its original or the complete converted file.
TEST(Migrate, KilledHalfwayAndResumed) {
  TempDir t;
  fs::path dir = t.path / "slots";
  fs::create_directories(dir);
  const fs::path src = fixture("v0.5.0/hd64-f16-f16-faon.slot");
  const std::string args = "--ctk q8_0 --ctv q8_0 -m " + kModel;
  const std::string original = slurp(src), converted = expected_conversion(src, t.path, args);
  std::mt19937 rng(7);
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 100; ++i) fs::copy_file(src, dir / ("slot-" + std::to_string(i) + ".bin"),
                                                fs::copy_options::overwrite_existing);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::execl(KVSNAP_BINARY, KVSNAP_BINARY, "migrate", dir.c_str(), "--ctk", "q8_0", "--ctv", "q8_0", "-m",
              kModel.c_str(), "--jobs", "2", "--json", static_cast<char*>(nullptr));
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 150));
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    size_t n_orig = 0, n_conv = 0;
    for (int i = 0; i < 100; ++i) {
      const std::string b = slurp(dir / ("slot-" + std::to_string(i) + ".bin"));
      ASSERT_TRUE(b == original || b == converted) << "round " << round << " file " << i << " is neither ("
                                                   << b.size() << " bytes)";
      (b == original ? n_orig : n_conv)++;
    }
    std::printf("round %d: killed with %zu converted, %zu original\n", round, n_conv, n_orig);
    ASSERT_EQ(sh(std::string(KVSNAP_BINARY) + " migrate " + dir.string() + " " + args + " >/dev/null"), 0);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(slurp(dir / ("slot-" + std::to_string(i) + ".bin")), converted);
    for (const auto& e : fs::directory_iterator(dir))
      ASSERT_EQ(e.path().filename().string().find(".kvsnap-tmp-"), std::string::npos) << "left " << e.path();
  }
}

}  // namespace
