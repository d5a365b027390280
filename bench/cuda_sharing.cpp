// Device tensors between processes, against torch.multiprocessing doing the
// same work in the same run (rounds interleaved):
//  1. test_cuda_send_many's shape: N five-element float32 tensors producer ->
//     relay (clone) -> consumer (sum on the device); tensors per second from
//     the producer's first send to the consumer's last sum done.
//  2. one tensor of each size, 4 KiB .. 1 GiB, sent and received twice: the
//     sender's put and the receiver's get (the first get of a chunk maps it,
//     the first of all also opens the sender's event).
//  3. ping-pong of a 4 KiB device tensor between two processes, each
//     synchronising its stream on receipt: round trips, p50 and p99. torch
//     cannot send on a tensor it received, so its echo sends a clone;
//     cohort's is timed both ways.
// Needs a CUDA device; prints why and exits 77 (skipped) without one.
#include "cohort/cuda/device.hpp"
#include "cohort/cuda/tensor.hpp"
#include "cohort/entry_point.hpp"
#include "cohort/queue.hpp"
#include "cohort/spawn_and_join.hpp"

#include "python.hpp"
#include "stats.hpp"
#include "support/cuda_kernels.hpp"

#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

using namespace cohort;

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sets CUDA up in this rank, so that its start is not timed.
void warm_up() {
  const tensor t = cuda::zeros({1}, dtype::float32, 0);
  cuda::synchronize(0);
}

// Ranks 0, 1, 2: producer, relay, consumer. Returns the producer's start
// and the consumer's end (steady_clock, which every process shares).
std::int64_t pipeline_rank(int rank, queue<tensor> first, queue<tensor> second, queue<int> ready, int n) {
  warm_up();
  if (rank == 0) {
    ready.get();
    ready.get();
    const auto start = now_ns();
    for (int i = 0; i < n; ++i) first.put(cuda::full({5}, i % 128, dtype::float32, 0));
    return start;
  }
  if (rank == 1) {
    ready.put(1);
    for (int i = 0; i < n; ++i) second.put(cuda::clone(*first.get()));
    return 0;
  }
  tensor sum = cuda::zeros({5}, dtype::float32, 0);
  auto& kernels = test::kernels::get();
  ready.put(1);
  for (int i = 0; i < n; ++i) {
    const tensor t = *second.get();
    kernels.add_f32(sum.raw_data(), t.raw_data(), 5, cuda::current_stream());
  }
  const tensor total = cuda::to_cpu(sum);
  const auto end = now_ns();
  double expected = 0;  // exact in float32: below 2^24 for n up to 260,000
  for (int i = 0; i < n; ++i) expected += i % 128;
  const float got = total.data<float>()[0];
  if (got != static_cast<float>(expected)) throw std::runtime_error(fmt::format("sum {} != {}", got, expected));
  return end;
}
COHORT_ENTRYPOINT(pipeline_rank);

const std::int64_t sizes[] = {4 << 10, 1 << 20, 16 << 20, 256 << 20, std::int64_t{1} << 30};

// Rank 0 sends one tensor of each size twice, rank 1 receives them; each
// times its own side, in ns: [put, put] per size for rank 0, [get, get]
// per size for rank 1. The receiver starts its clock once the value is in
// the queue (`posted`), so that only the receipt is timed.
std::vector<std::int64_t> sizes_rank(int rank, queue<tensor> q, queue<int> posted, queue<int> back) {
  warm_up();
  std::vector<std::int64_t> times;
  for (auto bytes : sizes) {
    for (int round = 0; round < 2; ++round) {
      if (rank == 0) {
        tensor t = cuda::full({bytes / 4}, round, dtype::float32, 0);
        cuda::synchronize(0);
        const auto start = now_ns();
        q.put(t);
        times.push_back(now_ns() - start);
        posted.put(1);
        back.get();  // received and dropped
      } else {
        posted.get();
        const auto start = now_ns();
        tensor t = *q.get();
        times.push_back(now_ns() - start);
        t = tensor();
        cuda::synchronize(0);
        back.put(1);
      }
    }
  }
  return times;
}
COHORT_ENTRYPOINT(sizes_rank);

// Rank 0 sends a 4 KiB tensor to rank 1 and waits for it to come back,
// `trips` times; rank 1 sends back what it got (`clone`: a clone of it).
// Each synchronises its stream on receipt. Rank 0 returns each trip's ns.
std::vector<std::int64_t> pingpong_rank(int rank, queue<tensor> there, queue<tensor> back, int trips, int clone) {
  warm_up();
  std::vector<std::int64_t> times;
  if (rank == 0) {
    const tensor t = cuda::full({1024}, 1, dtype::float32, 0);
    cuda::synchronize(0);
    for (int i = 0; i < trips; ++i) {
      const auto start = now_ns();
      there.put(t);
      const tensor r = *back.get();
      cuda::synchronize(0);
      times.push_back(now_ns() - start);
    }
  } else {
    for (int i = 0; i < trips; ++i) {
      const tensor r = *there.get();
      cuda::synchronize(0);
      back.put(clone != 0 ? cuda::clone(r) : r);
    }
  }
  return times;
}
COHORT_ENTRYPOINT(pingpong_rank);

const char* python_script = R"(
import sys, time
def pipeline_rank(rank, first, second, ready, done, n, out):
    import torch
    torch.zeros(1, device='cuda'); torch.cuda.synchronize()
    if rank == 0:
        ready.get(); ready.get()
        start = time.monotonic_ns()
        for i in range(n):
            t = torch.full([5], i % 128, device='cuda', dtype=torch.float32)
            first.put(t); del t
        out.put(('start', start))
        done.wait()
    elif rank == 1:
        ready.put(1)
        for i in range(n):
            t = first.get()
            second.put(t.clone()); del t
        done.wait()
    else:
        s = torch.zeros(5, device='cuda')
        ready.put(1)
        for i in range(n):
            t = second.get()
            s += t; del t
        v = s.cpu()
        out.put(('end', time.monotonic_ns()))
        assert float(v[0]) == sum(i % 128 for i in range(n)), float(v[0])
        done.set()

def sizes_rank(rank, q, posted, back, done, sizes, out):
    import torch
    torch.zeros(1, device='cuda'); torch.cuda.synchronize()
    times = []
    kept = []
    for size in sizes:
        for r in range(2):
            if rank == 0:
                t = torch.full([size // 4], r, device='cuda', dtype=torch.float32)
                torch.cuda.synchronize()
                start = time.monotonic_ns()
                q.put(t)
                times.append(time.monotonic_ns() - start)
                kept.append(t)  # torch: the sender keeps what it sent alive
                posted.put(1)
                back.get()
            else:
                posted.get()
                start = time.monotonic_ns()
                t = q.get()
                times.append(time.monotonic_ns() - start)
                del t
                torch.cuda.synchronize()
                back.put(1)
    out.put((rank, times))
    if rank == 0: done.wait()
    else: done.set()

def pingpong_rank(rank, there, back, done, trips, out):
    import torch
    torch.zeros(1, device='cuda'); torch.cuda.synchronize()
    if rank == 0:
        t = torch.full([1024], 1.0, device='cuda'); torch.cuda.synchronize()
        times = []
        for _ in range(trips):
            start = time.monotonic_ns()
            there.put(t)
            r = back.get()
            torch.cuda.current_stream().synchronize()
            times.append(time.monotonic_ns() - start)
            del r
        out.put(times)
        done.wait()
    else:
        for _ in range(trips):
            r = there.get()
            torch.cuda.current_stream().synchronize()
            back.put(r.clone()); del r
        done.set()

if __name__ == '__main__':
    what = sys.argv[1]
    try:
        import torch, torch.multiprocessing as mp
        ctx = mp.get_context('spawn')
        out = ctx.Queue()
        done = ctx.Event()
        if what == 'pipeline':
            n = int(sys.argv[2])
            first, second, ready = ctx.Queue(), ctx.Queue(), ctx.Queue()
            ps = [ctx.Process(target=pipeline_rank, args=(r, first, second, ready, done, n, out)) for r in range(3)]
            for p in ps: p.start()
            got = dict(out.get(timeout=600) for _ in range(2))
            for p in ps: p.join()
            if any(p.exitcode != 0 for p in ps): raise RuntimeError('a rank failed')
            print('torch_pipeline', (got['end'] - got['start']) / 1e9, flush=True)
        elif what == 'pingpong':
            trips = int(sys.argv[2])
            there, back = ctx.Queue(), ctx.Queue()
            ps = [ctx.Process(target=pingpong_rank, args=(r, there, back, done, trips, out)) for r in range(2)]
            for p in ps: p.start()
            times = out.get(timeout=600)
            for p in ps: p.join()
            print('torch_pingpong', *times, flush=True)
        else:
            sizes = [int(s) for s in sys.argv[2:]]
            q, posted, back = ctx.Queue(), ctx.Queue(), ctx.Queue()
            ps = [ctx.Process(target=sizes_rank, args=(r, q, posted, back, done, sizes, out)) for r in range(2)]
            for p in ps: p.start()
            got = dict(out.get(timeout=600) for _ in range(2))
            for p in ps: p.join()
            print('torch_sizes', *got[0], *got[1], flush=True)
    except Exception as e:
        print('failed', what, type(e).__name__, str(e).replace('\n', ' ')[:200], flush=True)
)";

// What one run of the torch baseline printed: the numbers after its `key`,
// or why it failed (the script's own "failed" line, else why the
// interpreter failed, else that it printed no `key`).
struct torch_run {
  std::vector<double> numbers;
  std::string failure;
};

torch_run torch_numbers(const std::string& args, const std::string& key) {
  torch_run result;
  const auto output = bench::run_python(python_script, args);
  bool answered = false;
  for (const auto& line : output.lines) {
    std::istringstream in(line);
    std::string first;
    in >> first;
    if (first == key) {
      answered = true;
      double v;
      while (in >> v) result.numbers.push_back(v);
    } else if (first == "failed" && result.failure.empty()) {
      std::getline(in >> std::ws, result.failure);
    }
  }
  if (result.failure.empty()) result.failure = output.failure;
  if (result.failure.empty() && !answered) result.failure = fmt::format("it printed no \"{}\" line", key);
  if (!result.failure.empty()) result.numbers.clear();
  return result;
}

int run(int argc, char** argv);

}  // namespace

// A failure is printed on stderr after what was measured before it.
int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  return cohort::bench::run_reporting("cuda_sharing", [&] { return run(argc, argv); });
}

namespace {

int run(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  // This process sets CUDA up (the ranks start by spawn, so they may).
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) {
    fmt::print("cuda_sharing: skipped: {}\n", why);
    return 77;
  }
  fmt::print("device tensors between processes: {} five-element tensors producer -> relay (clone) -> consumer (sum), "
             "{} rounds interleaved, the one or the other first in alternate rounds\n", n, rounds);
  // torch's rates and cohort's over them, round by round. A torch round
  // that fails ends its rounds: torch then prints as failed, with why, and
  // no figure of the rounds it made before.
  std::vector<double> ours, theirs, ratios;
  std::string torch_failure;
  for (int r = 0; r < rounds; ++r) {
    double torch_rate = 0;
    bench::in_turns(
        r,
        [&] {
          queue<tensor> first(1024), second(1024);
          queue<int> ready(4);
          const auto ends = spawn_and_join(pipeline_rank, std::tuple{first, second, ready, n}, 3);
          const double seconds = static_cast<double>(ends.at(2) - ends.at(0)) / 1e9;
          ours.push_back(n / seconds);
        },
        [&] {
          if (!torch_failure.empty()) return;
          const auto torch = torch_numbers(fmt::format("pipeline {}", n), "torch_pipeline");
          if (!torch.failure.empty())
            torch_failure = torch.failure;
          else if (torch.numbers.size() != 1 || torch.numbers[0] <= 0)
            torch_failure = fmt::format("it answered {} numbers, the first {}", torch.numbers.size(),
                                        torch.numbers.empty() ? 0.0 : torch.numbers[0]);
          else
            torch_rate = n / torch.numbers[0];
        });
    fmt::print("  round {}: cohort {:.0f} tensors/s, torch {}\n", r, ours.back(),
               torch_rate > 0 ? fmt::format("{:.0f} tensors/s ({:.1f}x)", torch_rate, ours.back() / torch_rate)
                              : "failed");
    if (torch_rate > 0) {
      theirs.push_back(torch_rate);
      ratios.push_back(ours.back() / torch_rate);
    }
  }
  fmt::print("cohort: {}\n", bench::spread_text(ours, "{:.0f}", "tensors/s"));
  if (torch_failure.empty() && !theirs.empty()) {
    fmt::print("torch.multiprocessing: {}\n", bench::spread_text(theirs, "{:.0f}", "tensors/s"));
    fmt::print("cohort / torch: {}\n", bench::spread_text(ratios, "{:.1f}", "x"));
  } else {
    fmt::print("torch.multiprocessing: failed: {}\n", torch_failure.empty() ? "no result" : torch_failure);
  }

  fmt::print("\none tensor of each size sent twice (first: a new chunk mapped; the first of all opens the event too), us\n");
  queue<tensor> q(4);
  queue<int> posted(4), back(4);
  const auto times = spawn_and_join(sizes_rank, std::tuple{q, posted, back}, 2);
  std::string size_args;
  for (auto s : sizes) size_args += fmt::format(" {}", s);
  const auto torch_sizes = torch_numbers("sizes" + size_args, "torch_sizes");
  const auto& torch_times = torch_sizes.numbers;
  const std::size_t count = std::size(sizes) * 2;
  fmt::print("{:>12} {:>10} {:>10} {:>10} {:>10}   {:>10} {:>10} {:>10} {:>10}\n", "bytes", "put 1", "put 2", "get 1", "get 2",
             "torch put1", "put 2", "get 1", "get 2");
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    const auto us = [](double ns) { return fmt::format("{:.1f}", ns / 1e3); };
    std::string torch_cols = "failed";
    if (torch_times.size() == 2 * count) {
      torch_cols = fmt::format("{:>10} {:>10} {:>10} {:>10}", us(torch_times[2 * i]), us(torch_times[2 * i + 1]),
                               us(torch_times[count + 2 * i]), us(torch_times[count + 2 * i + 1]));
    }
    fmt::print("{:>12} {:>10} {:>10} {:>10} {:>10}   {}\n", sizes[i], us(static_cast<double>(times.at(0).at(2 * i))),
               us(static_cast<double>(times.at(0).at(2 * i + 1))), us(static_cast<double>(times.at(1).at(2 * i))),
               us(static_cast<double>(times.at(1).at(2 * i + 1))), torch_cols);
  }
  if (torch_times.size() != 2 * count) {
    fmt::print("torch.multiprocessing: failed: {}\n",
               !torch_sizes.failure.empty() ? torch_sizes.failure
                                            : fmt::format("it answered {} numbers of {}", torch_times.size(), 2 * count));
  }

  constexpr int trips = 1000;
  fmt::print("\nping-pong of a 4 KiB device tensor, {} round trips, each side synchronising its stream on receipt, us\n", trips);
  // One row; where `ns` is empty, failed and why.
  const auto show = [](const char* who, std::vector<double> ns, const std::string& failure = "no result") {
    if (ns.empty()) {
      fmt::print("  {:<40} failed: {}\n", who, failure);
      return 0.0;
    }
    const double p50 = bench::percentile(ns, 50) / 1e3;
    fmt::print("  {:<40} p50 {:>8.1f}  p99 {:>8.1f}\n", who, p50, bench::percentile(ns, 99) / 1e3);
    return p50;
  };
  double ours_p50 = 0, ours_clone_p50 = 0;
  for (int clone : {0, 1}) {
    queue<tensor> there(4), back_q(4);
    const auto trip_times = spawn_and_join(pingpong_rank, std::tuple{there, back_q, trips, clone}, 2);
    std::vector<double> ns(trip_times.at(0).begin(), trip_times.at(0).end());
    (clone != 0 ? ours_clone_p50 : ours_p50) = show(clone != 0 ? "cohort, echo sends a clone" : "cohort, echo sends it back", ns);
  }
  const auto torch_trips = torch_numbers(fmt::format("pingpong {}", trips), "torch_pingpong");
  const double torch_p50 = show("torch.multiprocessing, echo sends a clone", torch_trips.numbers, torch_trips.failure);
  if (torch_p50 > 0 && ours_clone_p50 > 0) {
    fmt::print("  p50 torch / cohort: {:.1f}x (both clone), {:.1f}x (cohort sends it back)\n", torch_p50 / ours_clone_p50,
               torch_p50 / ours_p50);
  }
  return 0;
}

}  // namespace
