// Replays an allocsim CSV trace through libc10_cuda's caching allocator (raw_alloc /
// raw_delete), the native speed of PyTorch's allocator. Prints events per second.
#include <c10/cuda/CUDACachingAllocator.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>
int main(int argc, char** argv) {
  std::ifstream in(argv[1]);
  int runs = argc > 2 ? std::stoi(argv[2]) : 3;
  std::string line;
  std::getline(in, line);
  std::vector<std::string> head;
  { std::stringstream ss(line); std::string c; while (std::getline(ss, c, ',')) head.push_back(c); }
  auto col = [&](const char* n) { return int(std::find(head.begin(), head.end(), n) - head.begin()); };
  int io = col("op"), ii = col("id"), ib = col("bytes");
  std::vector<std::pair<long long, long long>> ops;  // (id, bytes or -1)
  while (std::getline(in, line)) {
    std::vector<std::string> c; std::stringstream ss(line); std::string x;
    while (std::getline(ss, x, ',')) c.push_back(x);
    if (c[io] == "alloc") ops.push_back({std::stoll(c[ii]), std::stoll(c[ib])});
    else if (c[io] == "free" || c[io] == "free_completed") ops.push_back({std::stoll(c[ii]), -1});
  }
  long long max_id = 0; for (auto& o : ops) max_id = std::max(max_id, o.first);
  c10::cuda::CUDACachingAllocator::init(1);
  std::vector<double> rates;
  for (int r = 0; r < runs; r++) {
    std::vector<void*> live(max_id + 1, nullptr);
    auto t = std::chrono::steady_clock::now();
    for (auto& o : ops) {
      if (o.second >= 0) live[o.first] = c10::cuda::CUDACachingAllocator::raw_alloc(o.second);
      else { c10::cuda::CUDACachingAllocator::raw_delete(live[o.first]); live[o.first] = nullptr; }
    }
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    for (auto p : live) if (p) c10::cuda::CUDACachingAllocator::raw_delete(p);
    c10::cuda::CUDACachingAllocator::emptyCache();
    rates.push_back(ops.size() / dt);
  }
  std::sort(rates.begin(), rates.end());
  printf("torch-native %s events=%zu median_events_per_s=%.0f min=%.0f max=%.0f\n", argv[1], ops.size(),
         rates[rates.size() / 2], rates.front(), rates.back());
}
