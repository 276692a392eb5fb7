// The checkpoint files: atomic writes, manifests, and that partial or corrupt
// checkpoints (no manifest, truncated shard, wrong checksum, bad manifest) are
// never listed as committed, each with a clear reason.
#include "services/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagewise::checkpoint {
namespace {
namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() /
             absl::StrCat("stagewise_checkpoint_test_", ::getpid(), "_",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A committed checkpoint of `stages` shards at `step`, shard j holding
  // `bytes` bytes of j.
  std::string Commit(int64_t step, int stages = 2, int bytes = 100) {
    const std::string dir = StepDir(root_, "job-1", step);
    v1::CheckpointManifest m;
    m.set_format(kFormat);
    m.set_job_id("job-1");
    m.set_step(step);
    for (int j = 0; j < stages; ++j) {
      const std::string data(static_cast<size_t>(bytes), static_cast<char>('a' + j));
      EXPECT_TRUE(WriteFileAtomically(dir + "/" + ShardFileName(j), data).ok());
      v1::CheckpointShard* s = m.add_shards();
      s->set_stage(j);
      s->set_file(ShardFileName(j));
      s->set_bytes(bytes);
      s->set_crc32(Crc32(data));
    }
    EXPECT_TRUE(WriteManifest(dir, m).ok());
    return dir;
  }

  std::vector<int64_t> Steps(bool verify, std::vector<std::string>* skipped = nullptr) {
    std::vector<int64_t> steps;
    for (const Committed& c : ListCommitted(root_, "job-1", verify, skipped)) {
      steps.push_back(c.manifest.step());
    }
    return steps;
  }

  std::string root_;
};

TEST_F(CheckpointTest, LayoutAndCrc) {
  EXPECT_EQ(StepDir("/ck", "job-1", 120), "/ck/job-1/step-0000000120");
  EXPECT_EQ(ShardFileName(3), "stage-3.pt");
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(Crc32(""), 0u);
}

TEST_F(CheckpointTest, AtomicWriteLeavesNoTemporaries) {
  const std::string path = root_ + "/a/b/file";
  ASSERT_TRUE(WriteFileAtomically(path, "one").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "two!").ok());
  EXPECT_EQ(*ReadFile(path), "two!");
  int files = 0;
  for (const auto& e : fs::directory_iterator(root_ + "/a/b")) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
  EXPECT_TRUE(absl::IsNotFound(ReadFile(root_ + "/nope").status()));
}

TEST_F(CheckpointTest, ListsCommittedNewestFirst) {
  Commit(10);
  Commit(30);
  Commit(20);
  std::vector<std::string> skipped;
  EXPECT_EQ(Steps(true, &skipped), (std::vector<int64_t>{30, 20, 10}));
  EXPECT_TRUE(skipped.empty()) << absl::StrJoin(skipped, "; ");
  auto all = ListCommitted(root_, "job-1", false, nullptr);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].bytes, 200);
  EXPECT_TRUE(ListCommitted(root_, "job-none", true, nullptr).empty());
}

TEST_F(CheckpointTest, MissingManifestIsNotCommitted) {
  Commit(10);
  const std::string dir = Commit(20);
  fs::remove(dir + "/" + kManifestName);
  std::vector<std::string> skipped;
  EXPECT_EQ(Steps(false, &skipped), (std::vector<int64_t>{10}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step-0000000020: no MANIFEST (not committed)"), std::string::npos)
      << skipped[0];
}

TEST_F(CheckpointTest, TruncatedShardIsSkippedEvenWithoutChecksums) {
  Commit(10);
  const std::string dir = Commit(20);
  fs::resize_file(dir + "/stage-1.pt", 40);
  std::vector<std::string> skipped;
  EXPECT_EQ(Steps(false, &skipped), (std::vector<int64_t>{10}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("stage-1.pt: 40 bytes, the manifest says 100"), std::string::npos)
      << skipped[0];
  const absl::Status s = VerifyFile(dir + "/stage-1.pt", 100, 0);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;
}

TEST_F(CheckpointTest, WrongChecksumIsSkippedWhenVerifying) {
  Commit(10);
  const std::string dir = Commit(20);
  {
    std::fstream f(dir + "/stage-0.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(50);
    f.put('Z');  // same size, different bytes
  }
  EXPECT_EQ(Steps(false), (std::vector<int64_t>{20, 10}));  // sizes alone cannot tell
  std::vector<std::string> skipped;
  EXPECT_EQ(Steps(true, &skipped), (std::vector<int64_t>{10}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("checksum mismatch"), std::string::npos) << skipped[0];
}

TEST_F(CheckpointTest, MissingShardAndBadManifestsAreSkipped) {
  Commit(10);
  fs::remove(Commit(20) + "/stage-0.pt");
  std::ofstream(Commit(30) + "/MANIFEST") << "format: 1\nnot a field: {";
  {
    const std::string dir = Commit(40);
    auto m = ReadManifest(dir);
    ASSERT_TRUE(m.ok());
    m->mutable_shards(1)->set_stage(0);  // stage 0 twice
    ASSERT_TRUE(WriteManifest(dir, *m).ok());
  }
  {
    const std::string dir = Commit(50);
    auto m = ReadManifest(dir);
    m->set_format(99);
    ASSERT_TRUE(WriteManifest(dir, *m).ok());
  }
  std::vector<std::string> skipped;
  EXPECT_EQ(Steps(true, &skipped), (std::vector<int64_t>{10}));
  const std::string all = absl::StrJoin(skipped, "\n");
  EXPECT_EQ(skipped.size(), 4u) << all;
  EXPECT_NE(all.find("stage-0.pt: missing"), std::string::npos) << all;
  EXPECT_NE(all.find("does not parse"), std::string::npos) << all;
  EXPECT_NE(all.find("shards[1] is stage 0, expected 1"), std::string::npos) << all;
  EXPECT_NE(all.find("format 99"), std::string::npos) << all;
}

TEST_F(CheckpointTest, MarkCorruptHidesItForGood) {
  Commit(10);
  const std::string dir = Commit(20);
  ASSERT_TRUE(MarkCorrupt(dir, "stage 1: checksum mismatch").ok());
  std::vector<std::string> skipped;
  EXPECT_EQ(Steps(true, &skipped), (std::vector<int64_t>{10}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("marked corrupt"), std::string::npos) << skipped[0];
  EXPECT_EQ(*ReadFile(dir + "/CORRUPT"), "stage 1: checksum mismatch\n");
}

TEST_F(CheckpointTest, PruneKeepsTheNewest) {
  for (int64_t step : {10, 20, 30, 40}) Commit(step);
  fs::remove(Commit(15) + "/" + kManifestName);  // an abandoned, uncommitted one
  fs::remove(Commit(50) + "/" + kManifestName);  // in progress: newer than the newest
  auto removed = Prune(root_, "job-1", 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->size(), 3u);  // 20, 15, 10
  EXPECT_EQ(Steps(true), (std::vector<int64_t>{40, 30}));
  EXPECT_TRUE(fs::exists(StepDir(root_, "job-1", 50)));
  EXPECT_FALSE(fs::exists(StepDir(root_, "job-1", 15)));
}

TEST_F(CheckpointTest, ACommitClearsTheCorruptionMarksOfItsStep) {
  const std::string dir = Commit(20);
  ASSERT_TRUE(MarkCorrupt(dir, "stage 0: truncated").ok());
  EXPECT_TRUE(Steps(false).empty());
  Commit(20);  // the step ran again and its shards were committed anew
  EXPECT_FALSE(fs::exists(dir + "/CORRUPT"));
  EXPECT_FALSE(fs::exists(dir + "/MANIFEST.corrupt"));
  EXPECT_EQ(Steps(true), (std::vector<int64_t>{20}));
}

TEST_F(CheckpointTest, PruneRemovesFilesOutsideTheLayout) {
  const std::string kept = Commit(30, /*stages=*/2);
  Commit(40, 2);
  std::ofstream(kept + "/stage-5.pt") << "a shard of an earlier try with more stages";
  std::ofstream(kept + "/stage-0.pt.tmp-123-4") << "a writer that died";
  std::ofstream(JobDir(root_, "job-1") + "/stage-0.pt") << "outside any step";
  std::ofstream(JobDir(root_, "job-1") + "/notes.txt") << "not ours to judge";
  auto removed = Prune(root_, "job-1", 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->size(), 3u);
  EXPECT_FALSE(fs::exists(kept + "/stage-5.pt"));
  EXPECT_FALSE(fs::exists(kept + "/stage-0.pt.tmp-123-4"));
  EXPECT_FALSE(fs::exists(JobDir(root_, "job-1") + "/stage-0.pt"));
  EXPECT_TRUE(fs::exists(JobDir(root_, "job-1") + "/notes.txt"));
  EXPECT_EQ(Steps(true), (std::vector<int64_t>{40, 30}));
}

TEST_F(CheckpointTest, ProbeWritableNamesTheField) {
  EXPECT_TRUE(ProbeWritable(root_ + "/ok").ok());
  std::ofstream(root_ + "/file") << "x";
  const absl::Status s = ProbeWritable(root_ + "/file/sub");
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("checkpoint.dir: cannot write"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace stagewise::checkpoint

namespace stagewise::checkpoint {
namespace {

// A shard's block modes: written typed, read back typed; a manifest written
// before the typed field (modes spelt "store" / "rebuild") still reads; a
// wrong count or spelling is DATA_LOSS naming the shard.
TEST(ShardModesTest, TypedAndOlderManifestsReadTheSame) {
  v1::CheckpointShard shard;
  shard.set_block_begin(4);
  shard.set_block_end(7);
  const std::vector<BlockMode> modes = {BlockMode::kStore, BlockMode::kRebuild, BlockMode::kStore};
  SetShardModes(modes, &shard);
  EXPECT_EQ(shard.block_modes_size(), 0);
  ASSERT_EQ(shard.modes_size(), 3);
  EXPECT_EQ(shard.modes(1), v1::BLOCK_MODE_REBUILD);
  auto typed = ShardModes(shard);
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(*typed, modes);

  v1::CheckpointShard old;
  old.set_block_begin(4);
  old.set_block_end(7);
  for (const char* m : {"store", "rebuild", "store"}) old.add_block_modes(m);
  auto read = ShardModes(old);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, modes);

  old.set_block_modes(1, "sideways");
  EXPECT_EQ(ShardModes(old).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ShardModes(old).status().message().find("sideways"), std::string::npos);
  shard.set_block_end(9);  // 5 blocks, 3 modes
  EXPECT_NE(ShardModes(shard).status().message().find("3 block modes for 5 blocks"),
            std::string::npos);
  shard.set_block_end(7);
  shard.set_modes(0, v1::BLOCK_MODE_UNSPECIFIED);
  EXPECT_EQ(ShardModes(shard).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace stagewise::checkpoint
