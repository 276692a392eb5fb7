// Helpers of the JobStore tests: a store on a path, a job record, a
// temporary directory.
#ifndef STAGEWISE_TESTS_UNIT_JOB_STORE_FIXTURES_H_
#define STAGEWISE_TESTS_UNIT_JOB_STORE_FIXTURES_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/store.h"

namespace stagewise::coordinator::testing {

inline std::unique_ptr<JobStore> OpenOrDie(const std::string& path) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

inline JobRecord MakeJob(const std::string& id, int64_t created_ms = 0) {
  JobRecord record;
  record.status.set_job_id(id);
  record.status.set_name(absl::StrCat("name-of-", id));
  record.status.set_created_unix_ms(created_ms);
  record.status.set_algorithm("petra");
  record.status.set_num_stages(4);
  record.status.set_total_steps(1000);
  record.spec_yaml = absl::StrCat("name: ", id, "\nmodel: revnet18\n");
  return record;
}

// A fresh directory under the test temp dir, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "job_store_XXXXXX").string();
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace stagewise::coordinator::testing

#endif  // STAGEWISE_TESTS_UNIT_JOB_STORE_FIXTURES_H_
