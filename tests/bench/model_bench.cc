// Per-block forward/backward time of a zoo model (not a test: prints a table).
//   build/bin/stagewise_model_bench JOB.yaml [batch] [repeats]
#include <torch/torch.h>

#include <chrono>
#include <iostream>

#include "absl/strings/str_format.h"
#include "services/models/model.h"
#include "services/spec/job_spec.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: stagewise_model_bench JOB.yaml [batch] [repeats]\n";
    return 2;
  }
  auto spec = stagewise::LoadJobSpec(argv[1]);
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  const int64_t batch = argc > 2 ? std::stoll(argv[2]) : spec->batch_size;
  const int repeats = argc > 3 ? std::stoi(argv[3]) : 5;
  auto model = stagewise::models::BuildModel(spec->model, spec->seed);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 2;
  }
  std::cout << absl::StrFormat("threads %d, batch %d\n", at::get_num_threads(), batch);
  std::cout << absl::StrFormat("%-6s %-11s %12s %12s %10s\n", "block", "kind", "forward ms",
                               "backward ms", "params");
  std::vector<int64_t> shape = {batch};
  shape.insert(shape.end(), spec->model.input_shape.begin(), spec->model.input_shape.end());
  torch::Tensor h = torch::randn(shape);
  double total_f = 0, total_b = 0;
  for (const auto& block : (*model)->blocks()) {
    torch::Tensor in = h.detach().requires_grad_(true);
    torch::Tensor out = block->forward(in);  // warm-up
    out.backward(torch::ones_like(out));
    double f = 0, b = 0;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      out = block->forward(in);
      auto t1 = std::chrono::steady_clock::now();
      out.backward(torch::ones_like(out));
      auto t2 = std::chrono::steady_clock::now();
      f += std::chrono::duration<double, std::milli>(t1 - t0).count();
      b += std::chrono::duration<double, std::milli>(t2 - t1).count();
    }
    f /= repeats;
    b /= repeats;
    total_f += f;
    total_b += b;
    std::cout << absl::StrFormat("%-6d %-11s %12.2f %12.2f %10d\n", block->info().index,
                                 block->info().kind, f, b, block->num_parameters());
    h = out.detach();
  }
  std::cout << absl::StrFormat("%-18s %12.2f %12.2f   => %.0f samples/s (fwd+bwd)\n", "total",
                               total_f, total_b, 1000.0 * batch / (total_f + total_b));
  return 0;
}
