// CollectiveStores (coordinator/collective_store.h): the per-attempt maps the
// replicas of a job's stages meet through.
#include "coordinator/collective_store.h"

#include <gtest/gtest.h>

#include <string>

namespace stagewise::coordinator {
namespace {

using Op = v1::CollectiveStoreRequest;

v1::CollectiveStoreRequest Request(Op::Op op, const std::string& key, int attempt = 0,
                                   const std::string& value = "") {
  v1::CollectiveStoreRequest r;
  r.set_job_id("job-1");
  r.set_attempt(attempt);
  r.set_op(op);
  r.set_key(key);
  r.set_value(value);
  return r;
}

TEST(CollectiveStores, SetGetCheckAddDeleteCount) {
  CollectiveStores stores;
  v1::CollectiveStoreResponse resp;
  ASSERT_TRUE(stores.Apply(Request(Op::GET, "a"), &resp).ok());
  EXPECT_FALSE(resp.found());
  ASSERT_TRUE(stores.Apply(Request(Op::SET, "a", 0, "xyz"), &resp).ok());
  resp.Clear();
  ASSERT_TRUE(stores.Apply(Request(Op::GET, "a"), &resp).ok());
  EXPECT_TRUE(resp.found());
  EXPECT_EQ(resp.value(), "xyz");
  v1::CollectiveStoreRequest check = Request(Op::CHECK, "");
  check.add_keys("a");
  check.add_keys("b");
  ASSERT_TRUE(stores.Apply(check, &resp).ok());
  EXPECT_FALSE(resp.found());
  v1::CollectiveStoreRequest add = Request(Op::ADD, "b");
  add.set_amount(3);
  ASSERT_TRUE(stores.Apply(add, &resp).ok());
  EXPECT_EQ(resp.number(), 3);
  add.set_amount(-1);
  ASSERT_TRUE(stores.Apply(add, &resp).ok());
  EXPECT_EQ(resp.number(), 2);
  ASSERT_TRUE(stores.Apply(check, &resp).ok());
  EXPECT_TRUE(resp.found());
  ASSERT_TRUE(stores.Apply(Request(Op::COUNT, ""), &resp).ok());
  EXPECT_EQ(resp.number(), 2);
  ASSERT_TRUE(stores.Apply(Request(Op::DELETE, "a"), &resp).ok());
  EXPECT_TRUE(resp.found());
  ASSERT_TRUE(stores.Apply(Request(Op::DELETE, "a"), &resp).ok());
  EXPECT_FALSE(resp.found());
  // ADD on a value that is not a counter.
  ASSERT_TRUE(stores.Apply(Request(Op::SET, "c", 0, "not a number"), &resp).ok());
  add.set_key("c");
  EXPECT_EQ(stores.Apply(add, &resp).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveStores, ANewAttemptStartsEmptyAndAnOldOneIsRefused) {
  CollectiveStores stores;
  v1::CollectiveStoreResponse resp;
  ASSERT_TRUE(stores.Apply(Request(Op::SET, "k", 0, "old"), &resp).ok());
  ASSERT_TRUE(stores.Apply(Request(Op::GET, "k", 1), &resp).ok());
  EXPECT_FALSE(resp.found());  // attempt 1 sees nothing of attempt 0
  EXPECT_EQ(stores.Apply(Request(Op::GET, "k", 0), &resp).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stores.jobs(), 1u);
  stores.Drop("job-1");
  EXPECT_EQ(stores.jobs(), 0u);
}

TEST(CollectiveStores, IsBounded) {
  CollectiveStores stores;
  v1::CollectiveStoreResponse resp;
  EXPECT_EQ(
      stores.Apply(Request(Op::SET, std::string(CollectiveStores::kMaxKeyBytes + 1, 'k')), &resp)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      stores
          .Apply(Request(Op::SET, "k", 0, std::string(CollectiveStores::kMaxValueBytes + 1, 'v')),
                 &resp)
          .code(),
      absl::StatusCode::kInvalidArgument);
  for (size_t i = 0; i < CollectiveStores::kMaxKeysPerAttempt; ++i) {
    ASSERT_TRUE(stores.Apply(Request(Op::SET, std::to_string(i)), &resp).ok());
  }
  EXPECT_EQ(stores.Apply(Request(Op::SET, "one more"), &resp).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(stores.Apply(Request(Op::SET, "0", 0, "overwrite"), &resp).ok());
  EXPECT_EQ(stores.Apply(Request(Op::OP_UNSPECIFIED, "x"), &resp).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagewise::coordinator
