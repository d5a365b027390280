// Tensor sharing between processes, against torch.multiprocessing (and
// Python's multiprocessing with plain ints) in the same run:
//  - a 3-stage pipeline (producer -> relay that clones -> summer) of
//    five-element int64 tensors, the CPU shape of torch's test_cuda_send_many;
//  - ping-pong latency of one small tensor between two processes, blocking
//    and awaited;
//  - the cost of sending one already-shared tensor, by size.
// Usage: tensor_sharing [pipeline tensors = 100000] [rounds = 3]
#include <cohort/queue.hpp>
#include <cohort/spawn_and_join.hpp>
#include <cohort/tensor.hpp>

#include "python.hpp"
#include "stats.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

using namespace cohort;
using steady = cohort::bench::clock;
using cohort::bench::seconds_since;

namespace bench_tensors {

// Rank 0 makes n tensors, rank 1 clones each, rank 2 sums them. The summer
// returns the sum and the seconds from its first pop to its last.
std::tuple<std::int64_t, double> pipeline_stage(int rank, queue<tensor> made, queue<tensor> cloned, int n) {
  if (rank == 0) {
    for (int i = 0; i < n; ++i) {
      tensor t = tensor::empty({5}, dtype::int64, {.shared = true});
      auto d = t.data<std::int64_t>();
      for (int j = 0; j < 5; ++j) d[j] = i + j;
      made.put(t);
    }
  } else if (rank == 1) {
    for (int i = 0; i < n; ++i) cloned.put(made.get()->clone({.shared = true}));
  } else {
    std::int64_t sum = 0;
    steady::time_point start;
    for (int i = 0; i < n; ++i) {
      tensor t = cloned.get().value();
      if (i == 0) start = steady::now();
      for (auto v : t.data<std::int64_t>()) sum += v;
    }
    return {sum, seconds_since(start)};
  }
  return {0, 0.0};
}
COHORT_ENTRYPOINT(pipeline_stage);

// Sends back every tensor it gets, blocking or awaited, until an empty one.
void echo(int, queue<tensor> in, queue<tensor> out, bool awaited) {
  if (!awaited) {
    for (;;) {
      tensor t = in.get().value();
      out.put(t);
      if (t.numel() == 0) return;
    }
  }
  asio::io_context io;
  auto loop = [&]() -> asio::awaitable<void> {
    for (;;) {
      tensor t = co_await in.pop();
      co_await out.push(t);
      if (t.numel() == 0) co_return;
    }
  };
  auto done = asio::co_spawn(io, loop(), asio::use_future);
  io.run();
  done.get();
}
COHORT_ENTRYPOINT(echo);

// One-way latencies (half round trips) of `trips` small tensors, in µs.
std::vector<double> ping_pong(int trips, bool awaited) {
  queue<tensor> there(16), back(16);
  std::vector<double> samples;
  auto parent = std::thread([&] {
    tensor t = tensor::zeros({4}, dtype::float32, {.shared = true});
    for (int i = 0; i < trips; ++i) {
      const auto start = steady::now();
      there.put(t);
      (void)back.get();
      samples.push_back(seconds_since(start) * 1e6 / 2);
    }
    there.put(tensor::empty({0}, dtype::float32, {.shared = true}));
    (void)back.get();
  });
  spawn_and_join(echo, std::tuple{there, back, awaited}, 1);
  parent.join();
  return samples;
}

// The time from put to the receiver holding the tensor and sending back
// an acknowledgement, for one tensor already in shared memory, in ms.
double send_cost(std::size_t bytes, int rounds) {
  queue<tensor> there(4), back(4);
  tensor big = tensor::empty({static_cast<std::int64_t>(bytes)}, dtype::uint8, {.shared = true});
  std::vector<double> samples;
  auto parent = std::thread([&] {
    for (int i = 0; i < rounds; ++i) {
      const auto start = steady::now();
      there.put(big);
      (void)back.get();
      samples.push_back(seconds_since(start) * 1e3);
    }
    there.put(tensor::empty({0}, dtype::uint8, {.shared = true}));
    (void)back.get();
  });
  spawn_and_join(echo, std::tuple{there, back, false}, 1);
  parent.join();
  return bench::median(samples);
}

// torch's senders must outlive the receivers' use of their tensors (its
// file_descriptor strategy fetches each descriptor from the sender), so its
// stages wait on `done`, as torch's own tests do.
const char* python_script = R"(
import multiprocessing as mp, statistics, sys, time
def produce(q, n, done):
    for i in range(n): q.put(i)
    done.wait()
def relay(a, b, n, done):
    for _ in range(n): b.put(a.get(timeout=60))
    done.wait()
def tproduce(q, n, done):
    import torch
    for i in range(n): q.put(torch.arange(i, i + 5, dtype=torch.int64))
    done.wait()
def trelay(a, b, n, done):
    for _ in range(n): b.put(a.get(timeout=60).clone())
    done.wait()
def run(ctx, make, move, n, summing):
    a, b, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    ps = [ctx.Process(target=make, args=(a, n, done)), ctx.Process(target=move, args=(a, b, n, done))]
    for p in ps: p.start()
    t = time.perf_counter(); total = 0
    for _ in range(n): total += summing(b.get(timeout=60))
    dt = time.perf_counter() - t
    done.set()
    for p in ps: p.join()
    return n / dt
def echo(a, b):
    while True:
        t = a.get(); b.put(t)
        if t.numel() == 0: return
if __name__ == '__main__':
    ints, tensors, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ctx = mp.get_context('fork')
    print('python_ints', statistics.median(run(ctx, produce, relay, ints, int) for _ in range(rounds)), flush=True)
    try:
        import torch, torch.multiprocessing as tmp
    except ImportError:
        sys.exit(0)
    tctx = tmp.get_context('fork')
    print('torch_pipeline', statistics.median(run(tctx, tproduce, trelay, tensors, lambda t: int(t.sum())) for _ in range(rounds)), flush=True)
    a, b = tctx.Queue(), tctx.Queue()
    p = tctx.Process(target=echo, args=(a, b)); p.start()
    small = torch.zeros(4).share_memory_()
    lat = []
    for _ in range(300):
        t = time.perf_counter(); a.put(small); b.get(timeout=60); lat.append((time.perf_counter() - t) * 1e6 / 2)
    lat.sort()
    print('torch_pingpong', lat[len(lat) // 2], lat[int(len(lat) * 0.99)], flush=True)
    for size in (4096, 1 << 20, 256 << 20):
        samples = []
        for _ in range(3):
            big = torch.empty(size, dtype=torch.uint8)
            t = time.perf_counter(); a.put(big); b.get(timeout=60); samples.append((time.perf_counter() - t) * 1e3)
        print('torch_send', size, statistics.median(samples), flush=True)
    a.put(torch.empty(0)); b.get(timeout=60); p.join()
)";

}  // namespace bench_tensors

int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  using namespace bench_tensors;
  const int n = argc > 1 ? std::atoi(argv[1]) : 100000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;

  std::int64_t expected = 0;
  for (std::int64_t i = 0; i < n; ++i) expected += 5 * i + 10;
  std::vector<double> rates, end_to_end;
  for (int r = 0; r < rounds; ++r) {
    queue<tensor> made(1024), cloned(1024);
    const auto start = steady::now();
    const auto out = spawn_and_join(pipeline_stage, std::tuple{made, cloned, n}, 3);
    const double total = seconds_since(start);
    const auto [sum, seconds] = out.at(2);
    if (sum != expected) {
      fmt::print(stderr, "tensor_sharing: the pipeline summed {}, expected {}\n", sum, expected);
      return 1;
    }
    rates.push_back(n / seconds);
    end_to_end.push_back(n / total);
  }
  const double rate = bench::median(rates);
  fmt::print("3-stage pipeline of {} five-element int64 tensors (producer -> relay that clones -> summer), median of {}\n",
             n, rounds);
  fmt::print("  {:<44} {:>12.0f} tensors/s\n", "cohort (first pop to last, in the summer)", rate);
  fmt::print("  {:<44} {:>12.0f} tensors/s\n", "cohort (start of 3 ranks to their end)", bench::median(end_to_end));

  const auto blocking = ping_pong(20000, false);
  const auto awaited = ping_pong(20000, true);
  fmt::print("ping-pong of one small tensor, one way (half a round trip), 20000 trips\n");
  fmt::print("  {:<44} p50 {:>7.2f} µs  p99 {:>7.2f} µs\n", "cohort blocking put/get", bench::percentile(blocking, 50),
             bench::percentile(blocking, 99));
  fmt::print("  {:<44} p50 {:>7.2f} µs  p99 {:>7.2f} µs\n", "cohort co_await push/pop", bench::percentile(awaited, 50),
             bench::percentile(awaited, 99));

  fmt::print("sending one tensor already in shared memory (put to the receiver's acknowledgement), median\n");
  std::map<std::size_t, double> ours;
  for (std::size_t size : {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{256} << 20, std::size_t{1} << 30}) {
    ours[size] = send_cost(size, 20);
    fmt::print("  cohort {:>12} bytes {:>10.3f} ms\n", size, ours[size]);
  }

  const int torch_tensors = std::min(n, 2000);
  for (const auto& line : bench::python_lines(python_script, fmt::format("{} {} {}", std::min(n, 100000), torch_tensors, rounds))) {
    char name[32];
    double a = 0, b = 0, c = 0;
    const int fields = std::sscanf(line.c_str(), "%31s %lf %lf %lf", name, &a, &b, &c);
    const std::string what = name;
    if (what == "python_ints" && fields >= 2) {
      fmt::print("  {:<44} {:>12.0f} items/s   cohort x{:.1f}\n", "Python multiprocessing, plain ints (pipeline)", a, rate / a);
    } else if (what == "torch_pipeline" && fields >= 2) {
      fmt::print("  {:<44} {:>12.0f} tensors/s cohort x{:.0f}\n",
                 fmt::format("torch.multiprocessing ({} tensors)", torch_tensors), a, rate / a);
    } else if (what == "torch_pingpong" && fields >= 3) {
      fmt::print("  {:<44} p50 {:>7.2f} µs  p99 {:>7.2f} µs  cohort blocking p50 x{:.0f}\n", "torch.multiprocessing ping-pong",
                 a, b, a / bench::percentile(blocking, 50));
    } else if (what == "torch_send" && fields >= 3) {
      const auto size = static_cast<std::size_t>(a);
      fmt::print("  torch  {:>12} bytes {:>10.3f} ms (private tensor, moved to shared memory on put)  cohort x{:.0f}\n", size,
                 b, b / ours[size]);
    }
  }
  return 0;
}
