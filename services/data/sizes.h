// Data sizes known without loading (or linking LibTorch): the coordinator
// schedules with them, every stage derives its step counts from them.
#ifndef STAGEWISE_SERVICES_DATA_SIZES_H_
#define STAGEWISE_SERVICES_DATA_SIZES_H_

#include <cstdint>

#include "services/common/job_spec.h"

namespace stagewise::data {

// The number of training samples `spec` yields, known without loading the
// data: every stage and the coordinator need the schedule, only stage 0 loads
// data (and checks that the real count agrees).
int64_t NominalTrainSize(const DataSpec& spec);

}  // namespace stagewise::data

#endif  // STAGEWISE_SERVICES_DATA_SIZES_H_
