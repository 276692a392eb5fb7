// The profile cache (services/profiler/profiler.h): two specs whose blocks
// would measure different times never share a cached profile; workers that
// profile the same key at once all get their profile and leave one file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "services/profiler/profiler.h"
#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

JobSpec Emulated(double forward_ms, double backward_ms, double weight_share) {
  auto spec = ParseJobSpec(
      "name: key\nmodel: {name: emulated, depth: 4}\n"
      "data: {dataset: synthetic, shape: [2, 4, 4], train_size: 64, test_size: 8}\n"
      "stages: {count: 2}\nsteps: 1\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->model.forward_ms = forward_ms;
  spec->model.backward_ms = backward_ms;
  spec->model.backward_weight_share = weight_share;
  return *spec;
}

std::string Key(const JobSpec& spec) { return planner::ProfileKey(spec, 32, torch::kCPU, 1, ""); }

TEST(ProfileKey, AnEmulatedModelsWaitsAreInTheKey) {
  const std::string base = Key(Emulated(20, 40, 0.5));
  EXPECT_EQ(base, Key(Emulated(20, 40, 0.5)));
  EXPECT_NE(base, Key(Emulated(40, 40, 0.5))) << "forward_ms";
  EXPECT_NE(base, Key(Emulated(20, 80, 0.5))) << "backward_ms";
  EXPECT_NE(base, Key(Emulated(20, 40, 0.25))) << "backward_weight_share";
}

planner::ProfileOptions Quick(const std::string& cache_dir) {
  planner::ProfileOptions o;
  o.warmup = 0;
  o.repeats = 1;
  o.cache_dir = cache_dir;
  return o;
}

class ProfileCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("stagewise-profile-cache-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(ProfileCache, WorkersProfilingTheSameKeyAtOnceAllSucceedAndLeaveOneFile) {
  const JobSpec spec = Emulated(0.2, 0.4, 0.5);
  std::vector<std::thread> workers;
  std::vector<absl::Status> results(4);
  for (size_t i = 0; i < results.size(); ++i) {
    workers.emplace_back([&, i] {
      results[i] = planner::CachedProfile(spec, 8, torch::kCPU, Quick(dir_.string())).status();
    });
  }
  for (auto& t : workers) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    files.push_back(e.path().filename().string());
  }
  ASSERT_EQ(files.size(), 1u) << "temporary files left behind";
  bool cached = false;
  auto again = planner::CachedProfile(spec, 8, torch::kCPU, Quick(dir_.string()), &cached);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(cached);
}

TEST_F(ProfileCache, ACacheThatCannotBeWrittenIsReportedNotAnError) {
  // The cache directory's place is a file: nothing can be created under it.
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  planner::ProfileOptions o = Quick((dir_ / "file" / "cache").string());
  std::mutex mu;
  std::vector<std::string> lines;
  o.progress = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(line);
  };
  bool cached = true;
  auto p = planner::CachedProfile(Emulated(0.2, 0.4, 0.5), 8, torch::kCPU, o, &cached);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(cached);
  EXPECT_FALSE(p->blocks.empty());
  bool reported = false;
  for (const std::string& l : lines) reported |= l.rfind("profile not cached: ", 0) == 0;
  EXPECT_TRUE(reported);
}

}  // namespace
}  // namespace stagewise
