// Tensor sharing between processes, against torch.multiprocessing (and
// Python's multiprocessing with plain ints), each measured the same way:
//  - a 3-stage pipeline (producer -> relay that clones -> summer) of
//    five-element int64 tensors, the CPU shape of torch's test_cuda_send_many,
//    timed from the summer's pops of each producer's first tensor, until
//    which none makes another, to the end of its last (see open_window);
//  - ping-pong latency of one small tensor between two processes, blocking
//    and awaited;
//  - the cost of sending one tensor, by size, both already in shared memory
//    and both private (the put copies them into shared memory).
// The pipeline also runs with two busy loops beside it, with 2 and 4
// producers, with its three stages on one CPU, and with plain integers in
// place of the tensors; the quiet and the loaded runs each take turns with the
// machine's raw ring (machine_limits --ring: the same three stages on two
// lock-free rings of 64-byte items, no bookkeeping, stages that yield their
// CPU when they wait), the one or the other first in alternate rounds,
// whose rate is timed from its stages' start to their end.
// The baselines take turns with cohort round by round: a Python process
// for each (Python's multiprocessing, torch.multiprocessing) lasts the run
// and makes one measurement per request, and in every round each of
// cohort's quiet pipeline, its plain int64 values, its ping-pong and its
// sends at each size runs in turn with its baseline's, the one or the other
// first in alternate rounds. The ratios are taken per round and printed as
// their median and range.
// Usage: tensor_sharing [--pipeline] [pipeline tensors = 100000] [rounds = 3] [sends per size = 10]
// (--pipeline: the pipeline alone, no baselines; rounds: the pipeline's, the
// ping-pong's and the sends')
#include <cohort/queue.hpp>
#include <cohort/spawn_and_join.hpp>
#include <cohort/tensor.hpp>

#include "arguments.hpp"
#include "load.hpp"
#include "python.hpp"
#include "stats.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <fmt/format.h>

#include <sched.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using namespace cohort;
using steady = cohort::bench::clock;
using cohort::bench::seconds_since;

namespace bench_tensors {

// The CPU time this process has used, in seconds: what a stage costs the
// machine, its spinning waits included and its sleeps not.
double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Opens a pipeline's window, on the summer's side: each producer has made
// its first item and waits on `go`; the summer, having popped those (so
// every stage has run, its one-time costs paid), starts its clock and lets
// the `producers` go, a value each. Every later item is then made, moved
// and summed inside the window, whatever the count. (With the producers
// free from the start, a count the queues hold could all be made before
// the summer's first pop, and the window timed the summer draining it.)
// Returns the window's start.
steady::time_point open_window(queue<int>& go, int producers) {
  const auto start = steady::now();
  for (int p = 0; p < producers; ++p) go.put(0);
  return start;
}

// Ranks 0..producers-1 make the n tensors between them (rank p the items
// p, p + producers, ...), the next rank clones each, the last sums them.
// Each returns its sum (the summer's; 0 for the others), the seconds from
// the window's opening (open_window) to the end of its last item (the
// summer's; the Python baselines time the same window), and its CPU
// seconds per tensor it handled, over its whole loop. n >= 2 * producers:
// each producer has an item inside the window too.
// A producer stays until the relay has taken every tensor (a value each
// on `relayed`): one whose whole share fits in the queue would otherwise
// exit before the relay has seen a slower one push, and the relay's pop
// would end with peer_lost (a queue waits only on peers it has seen).
std::tuple<std::int64_t, double, double> pipeline_stage(int rank, queue<tensor> made, queue<tensor> cloned,
                                                        queue<int> relayed, queue<int> go, int n, int producers) {
  const double cpu_start = process_cpu_seconds();
  // 0 for a stage that handled nothing.
  const auto cpu_per = [cpu_start](int handled) {
    return handled > 0 ? (process_cpu_seconds() - cpu_start) / handled : 0.0;
  };
  if (rank < producers) {
    int made_here = 0;
    for (int i = rank; i < n; i += producers, ++made_here) {
      tensor t = tensor::empty({5}, dtype::int64, {.shared = true});
      auto d = t.data<std::int64_t>();
      for (int j = 0; j < 5; ++j) d[j] = i + j;
      made.put(t);
      if (i == rank) (void)go.get();
    }
    const double cpu = cpu_per(made_here);
    (void)relayed.get();
    return {0, 0.0, cpu};
  }
  if (rank == producers) {
    for (int i = 0; i < n; ++i) cloned.put(made.get()->clone({.shared = true}));
    const double cpu = cpu_per(n);
    for (int p = 0; p < producers; ++p) relayed.put(0);
    return {0, 0.0, cpu};
  }
  std::int64_t sum = 0;
  const auto take = [&] {
    tensor t = cloned.get().value();
    for (auto v : t.data<std::int64_t>()) sum += v;
  };
  for (int i = 0; i < producers; ++i) take();
  const auto start = open_window(go, producers);
  for (int i = producers; i < n; ++i) take();
  const double window = seconds_since(start);
  return {sum, window, cpu_per(n)};
}
COHORT_ENTRYPOINT(pipeline_stage);

// The same three stages passing plain int64 values through the same
// queues, in the same window: what the queues cost without tensors.
std::tuple<std::int64_t, double> int_stage(int rank, queue<std::int64_t> made, queue<std::int64_t> passed,
                                           queue<int> go, int n) {
  if (rank == 0) {
    for (int i = 0; i < n; ++i) {
      made.put(i);
      if (i == 0) (void)go.get();
    }
  } else if (rank == 1) {
    for (int i = 0; i < n; ++i) passed.put(made.get().value());
  } else {
    std::int64_t sum = passed.get().value();
    const auto start = open_window(go, 1);
    for (int i = 1; i < n; ++i) sum += passed.get().value();
    return {sum, seconds_since(start)};
  }
  return {0, 0.0};
}
COHORT_ENTRYPOINT(int_stage);

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

// Waits until the echo process has started and sent back one tensor of
// its own: its start is then outside the clock, as torch's is (echoed()
// in the peer's script makes the same exchange). The tensor timed is not
// the one sent here.
void await_echo(queue<tensor>& there, queue<tensor>& back) {
  there.put(tensor::zeros({1}, dtype::uint8, {.shared = true}));
  (void)back.get();
}

// One-way latencies (half round trips) of `trips` small tensors, in µs.
std::vector<double> ping_pong(int trips, bool awaited) {
  queue<tensor> there(16), back(16);
  std::vector<double> samples;
  auto parent = std::thread([&] {
    tensor t = tensor::zeros({4}, dtype::float32, {.shared = true});
    await_echo(there, back);
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

// The time from put to the receiver holding the tensor and sending it back,
// in ms, of each of `sends` sends: of one tensor already in shared memory when
// `shared`, else of a fresh private tensor each time, which the put copies
// into shared memory. The elements are written, and the echo process is
// running, before the clock starts.
std::vector<double> send_cost(std::size_t bytes, bool shared, int sends) {
  queue<tensor> there(4), back(4);
  const auto size = static_cast<std::int64_t>(bytes);
  const tensor already = shared ? tensor::full({size}, 1, dtype::uint8, {.shared = true}) : tensor();
  std::vector<double> samples;
  auto parent = std::thread([&] {
    await_echo(there, back);
    for (int i = 0; i < sends; ++i) {
      const tensor t = shared ? already : tensor::full({size}, 1, dtype::uint8);
      const auto start = steady::now();
      there.put(t);
      (void)back.get();
      samples.push_back(seconds_since(start) * 1e3);
    }
    there.put(tensor::empty({0}, dtype::uint8, {.shared = true}));
    (void)back.get();
  });
  spawn_and_join(echo, std::tuple{there, back, false}, 1);
  parent.join();
  return samples;
}

// Keeps the calling thread, and the processes it starts while this lives
// (they inherit its CPUs), on one CPU: the first it may run on. The thread
// gets its CPUs back afterwards. Only this thread: ranks must then be
// started by it (start_threads = 1), not by spawn's starting threads.
class on_one_cpu {
 public:
  on_one_cpu() {
    if (::sched_getaffinity(0, sizeof before_, &before_) != 0) throw std::runtime_error("sched_getaffinity");
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &before_)) {
        CPU_SET(cpu, &one);
        break;
      }
    }
    if (::sched_setaffinity(0, sizeof one, &one) != 0) throw std::runtime_error("sched_setaffinity");
  }
  on_one_cpu(const on_one_cpu&) = delete;
  on_one_cpu& operator=(const on_one_cpu&) = delete;
  ~on_one_cpu() { ::sched_setaffinity(0, sizeof before_, &before_); }

 private:
  cpu_set_t before_;
};

// One pipeline run of n plain integers: its rate in values/s.
double int_pipeline_rate(int n) {
  queue<std::int64_t> made(1024), passed(1024);
  queue<int> go(8);
  const auto out = spawn_and_join(int_stage, std::tuple{made, passed, go, n}, 3);
  const auto [sum, seconds] = out.at(2);
  if (sum != std::int64_t{n} * (n - 1) / 2) throw std::runtime_error("the integer pipeline summed wrong");
  return (n - 1) / seconds;
}

// One pipeline run of n tensors: its rate in tensors/s, and the CPU time
// per tensor of each stage (the producers' mean).
struct pipeline_run {
  double rate;
  double producer_cpu, relay_cpu, summer_cpu;  // seconds per tensor
};
// `pinned`: this thread is on one CPU, and starts the ranks itself so that
// they inherit it.
pipeline_run pipeline_rate(int n, int producers, bool pinned = false) {
  queue<tensor> made(1024), cloned(1024);
  queue<int> relayed(8), go(8);
  const auto args = std::tuple{made, cloned, relayed, go, n, producers};
  join_options options;
  if (pinned) options.start_threads = 1;
  const auto out = spawn_and_join(pipeline_stage, args, producers + 2, options);
  const auto p = static_cast<std::size_t>(producers);
  const auto [sum, seconds, summer_cpu] = out.at(p + 1);
  std::int64_t expected = 0;
  for (std::int64_t i = 0; i < n; ++i) expected += 5 * i + 10;
  if (sum != expected) throw std::runtime_error(fmt::format("the pipeline summed {}, expected {}", sum, expected));
  double producer_cpu = 0;
  for (std::size_t r = 0; r < p; ++r) producer_cpu += std::get<2>(out.at(r)) / producers;
  return {(n - producers) / seconds, producer_cpu, std::get<2>(out.at(p)), summer_cpu};
}

// One figure that `machine_limits <args>` prints, or 0 when it failed.
double machine_limit(const std::string& args) {
  // Quoted for the shell that popen runs: each ' becomes '\''.
  std::string quoted = "'";
  for (const char c : std::string_view(COHORT_BENCH_MACHINE_LIMITS)) {
    if (c == '\'') quoted += "'\\''";
    else quoted += c;
  }
  quoted += "'";
  FILE* out = ::popen(fmt::format("{} {}", quoted, args).c_str(), "r");
  if (out == nullptr) return 0;
  double figure = 0;
  if (std::fscanf(out, "%lf", &figure) != 1) figure = 0;
  return ::pclose(out) == 0 ? figure : 0;
}

// The machine's raw ring moving `items`: items/s, or 0 when it failed.
double raw_ring_rate(long long items) { return machine_limit(fmt::format("--ring {}", items)); }

// The baselines, measured as above: plain blocking get()s, the pipeline's
// rate over the summer's first pop to its last, the producer holding back
// all but its first item until then (`go`); their samples come back
// whole, for stats.hpp's medians and percentiles. Run as a python_peer: "python" answers for Python's
// multiprocessing (and never imports torch), "torch" for
// torch.multiprocessing. Each request line is "key numbers..." and asks
// for one measurement, answered as "numbers...", or "failed why":
//   python_ints N               the pipeline of N plain ints: its rate
//   torch_pipeline N            the pipeline of N tensors: its rate
//   torch_pingpong TRIPS        each trip's one-way latency, in µs
//   torch_send_KIND SIZE SENDS  each send's ms; KIND shared or private
// torch's senders must outlive the receivers' use of their tensors (its
// file_descriptor strategy fetches each descriptor from the sender), so its
// stages wait on `done`, as torch's own tests do. A result not in within
// LIMIT seconds fails, and so do the rest.
const char* python_script = R"(
import multiprocessing as mp, signal, sys, time
LIMIT = 120
def produce(q, n, done, go):
    for i in range(n):
        q.put(i)
        if i == 0: go.wait()
    done.wait()
def relay(a, b, n, done):
    for _ in range(n): b.put(a.get())
    done.wait()
def tproduce(q, n, done, go):
    import torch
    for i in range(n):
        q.put(torch.arange(i, i + 5, dtype=torch.int64))
        if i == 0: go.wait()
    done.wait()
def trelay(a, b, n, done):
    for _ in range(n): b.put(a.get().clone())
    done.wait()
def pipeline(ctx, make, move, n, summing):
    a, b, done, go = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    ps = [ctx.Process(target=make, args=(a, n, done, go), daemon=True),
          ctx.Process(target=move, args=(a, b, n, done), daemon=True)]
    for p in ps: p.start()
    first = b.get()
    start = time.perf_counter()
    go.set()
    total = summing(first)
    for _ in range(n - 1): total += summing(b.get())
    rate = (n - 1) / (time.perf_counter() - start)
    done.set()
    for p in ps: p.join()
    return rate
def echo(a, b):
    while True:
        t = a.get(); b.put(t)
        if t.numel() == 0: return
# The echo's start, and its queues' feeder threads', are outside the clock,
# as cohort's are (await_echo): p.start() only forks, so one tensor goes
# there and back, untimed, before measure() starts its clock.
def echoed(ctx, measure):
    a, b = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=echo, args=(a, b), daemon=True); p.start()
    try:
        a.put(torch.zeros(1, dtype=torch.uint8).share_memory_()); b.get()
        return measure(a, b)
    finally:
        p.terminate(); p.join()
def ping_pong(trips):
    def measure(a, b):
        small = torch.zeros(4).share_memory_()
        lat = []
        for _ in range(trips):
            t = time.perf_counter(); a.put(small); b.get(); lat.append((time.perf_counter() - t) * 1e6 / 2)
        return lat
    return measure
def send(size, shared, sends):
    def measure(a, b):
        kept = torch.full((size,), 1, dtype=torch.uint8).share_memory_() if shared else None
        samples = []
        for _ in range(sends):
            big = kept if shared else torch.full((size,), 1, dtype=torch.uint8)
            t = time.perf_counter(); a.put(big); b.get(); samples.append((time.perf_counter() - t) * 1e3)
        return samples
    return measure
timed_out = False
def on_alarm(*_):
    raise TimeoutError(f'no result within {LIMIT} s')
def report(measure):
    global timed_out
    if timed_out:
        print('failed skipped after a timeout', flush=True); return
    signal.alarm(LIMIT)
    try:
        print(*measure(), flush=True)
    except Exception as e:
        timed_out = isinstance(e, TimeoutError)
        print('failed', type(e).__name__, str(e).splitlines()[0] if str(e) else '', flush=True)
    finally:
        signal.alarm(0)
if __name__ == '__main__':
    signal.signal(signal.SIGALRM, on_alarm)
    ctx = mp.get_context('fork')
    torch_failure = None
    if sys.argv[1] == 'torch':
        try:
            import torch, torch.multiprocessing as tmp
            tctx = tmp.get_context('fork')
        except Exception as e:
            torch_failure = f'import torch: {type(e).__name__}'
    print('ready', flush=True)
    for line in iter(sys.stdin.readline, ''):
        key, *numbers = line.split()
        numbers = [int(v) for v in numbers]
        if key == 'python_ints':
            report(lambda: [pipeline(ctx, produce, relay, numbers[0], int)])
        elif torch_failure:
            print('failed', torch_failure, flush=True)
        elif key == 'torch_pipeline':
            report(lambda: [pipeline(tctx, tproduce, trelay, numbers[0], lambda t: int(t.sum()))])
        elif key == 'torch_pingpong':
            report(lambda: echoed(tctx, ping_pong(numbers[0])))
        elif key.startswith('torch_send_'):
            report(lambda: echoed(tctx, send(numbers[0], key == 'torch_send_shared', numbers[1])))
        else:
            print('failed unknown request', key, flush=True)
)";

// A peer's figures, each taken in turn with cohort's of the same round,
// and why it failed where it did (the first reason; a peer that failed in
// any round prints as failed).
struct peer_figures {
  std::vector<std::vector<double>> rounds;  // what it answered, round by round
  std::string failure;

  // Asks `peer` for one measurement (`request`); keeps what it answers,
  // at least `count` numbers, or notes why it failed. True where it answered.
  bool ask(bench::python_peer& peer, const std::string& request, std::size_t count) {
    if (!failure.empty()) return false;
    const auto line = peer.ask(request);
    if (!line) {
      failure = peer.failure();
      return false;
    }
    std::istringstream words(*line);
    if (line->starts_with("failed")) {
      words.ignore(6);
      std::getline(words >> std::ws, failure);
      if (failure.empty()) failure = "no reason given";
      return false;
    }
    std::vector<double> values;
    for (double v; words >> v;) values.push_back(v);
    if (values.size() < count) {
      failure = fmt::format("it answered \"{}\"", *line);
      return false;
    }
    rounds.push_back(std::move(values));
    return true;
  }
  // The first number of each round.
  std::vector<double> firsts() const {
    std::vector<double> out;
    for (const auto& r : rounds) out.push_back(r.front());
    return out;
  }
  // Every round's numbers, one after another.
  std::vector<double> pooled() const {
    std::vector<double> out;
    for (const auto& r : rounds) out.insert(out.end(), r.begin(), r.end());
    return out;
  }
};

// The baselines' processes, and what each measured in turn with cohort.
struct peers {
  bench::python_peer python{python_script, {"python"}};
  bench::python_peer torch{python_script, {"torch"}};
  int python_ints = 0, torch_tensors = 0, torch_trips = 0;
  peer_figures ints, pipeline, pingpong;
  // Round by round: the ints' and the tensors' rates over cohort's of the
  // same round, and torch's ping-pong p50 over cohort's blocking p50.
  std::vector<double> ints_ratio, pipeline_ratio, pingpong_ratio;
  // By size: its sends, and their median over cohort's, round by round.
  std::map<std::size_t, peer_figures> shared, priv;
  std::map<std::size_t, std::vector<double>> shared_ratio, private_ratio;
};

// The pipeline quiet, beside two busy loops, and with 2 and 4 producers,
// each once per round in turn, the raw ring beside each of the first two
// (before or after it in alternate rounds); prints each. Where there are
// `peers`, each round's quiet run takes turns with torch's pipeline, and
// its plain int64 values with Python's ints, their ratios kept there.
void pipeline_section(int n, int rounds, peers* peers) {
  std::vector<double> quiet, loaded, share, two, four, one_cpu, of_two_cpus, ints, ring_quiet, ring_loaded,
      of_ring_quiet, of_ring_loaded, handover, surplus_in_handovers;
  // Each stage's CPU time per tensor, in ns: quiet, and on one CPU.
  std::vector<double> cpu[2][3];
  const auto note_cpu = [&cpu](int mode, const pipeline_run& run) {
    cpu[mode][0].push_back(run.producer_cpu * 1e9);
    cpu[mode][1].push_back(run.relay_cpu * 1e9);
    cpu[mode][2].push_back(run.summer_cpu * 1e9);
  };
  // About as long a window as cohort's, at the ring's rate here.
  const long long ring_items = 20LL * n;
  bool ring_failed = false;
  // cohort's run `ours`, which adds its rate to `rates`, and the raw ring's
  // into `ring`, the one or the other first in alternate rounds; cohort's
  // rate as a share of the ring's into `of_ring`.
  const auto beside_ring = [&](int round, std::vector<double>& ring, std::vector<double>& of_ring,
                               const std::vector<double>& rates, const auto& ours) {
    bool ring_ran = false;
    bench::in_turns(round, ours, [&] {
      if (ring_failed) return;
      const double rate = raw_ring_rate(ring_items);
      if (rate <= 0) {
        ring_failed = true;  // printed as failed; cohort's rows print all the same
        return;
      }
      ring.push_back(rate);
      ring_ran = true;
    });
    if (ring_ran) of_ring.push_back(100 * rates.back() / ring.back());
  };
  for (int r = 0; r < rounds; ++r) {
    bool torch_answered = false;
    bench::in_turns(
        r,
        [&] {
          beside_ring(r, ring_quiet, of_ring_quiet, quiet, [&] {
            const auto run = pipeline_rate(n, 1);
            quiet.push_back(run.rate);
            note_cpu(0, run);
          });
        },
        [&] {
          if (peers == nullptr) return;
          torch_answered =
              peers->pipeline.ask(peers->torch, fmt::format("torch_pipeline {}", peers->torch_tensors), 1);
        });
    if (torch_answered) peers->pipeline_ratio.push_back(quiet.back() / peers->pipeline.rounds.back().front());
    {
      const bench::busy_loops load(2);
      beside_ring(r, ring_loaded, of_ring_loaded, loaded, [&] { loaded.push_back(pipeline_rate(n, 1).rate); });
    }
    share.push_back(100 * loaded.back() / quiet.back());
    two.push_back(pipeline_rate(n, 2).rate);
    four.push_back(pipeline_rate(n, 4).rate);
    {
      const on_one_cpu pinned;
      const auto pinned_run = pipeline_rate(n, 1, true);
      one_cpu.push_back(pinned_run.rate);
      note_cpu(1, pinned_run);
    }
    of_two_cpus.push_back(100 * one_cpu.back() / quiet.back());
    // What the three stages spend per tensor on two CPUs above one, in
    // hand-overs of a cache line between CPUs measured in the same round.
    if (const double ns = machine_limit("--line"); ns > 0) {
      handover.push_back(ns);
      double surplus = 0;
      for (int stage = 0; stage < 3; ++stage) surplus += cpu[0][stage].back() - cpu[1][stage].back();
      surplus_in_handovers.push_back(surplus / ns);
    }
    bool python_answered = false;
    bench::in_turns(
        r, [&] { ints.push_back(int_pipeline_rate(static_cast<int>(std::min(5LL * n, 10'000'000LL)))); },
        [&] {
          if (peers == nullptr) return;
          python_answered = peers->ints.ask(peers->python, fmt::format("python_ints {}", peers->python_ints), 1);
        });
    if (python_answered) peers->ints_ratio.push_back(ints.back() / peers->ints.rounds.back().front());
  }
  fmt::print("3-stage pipeline (producers -> relay that clones -> summer) of {} five-element int64 tensors,\n"
             "median of {} rounds; for every contender, rate = items after the first ones / time from the\n"
             "summer's pops of each producer's first item (until which none makes another) to the end of its\n"
             "last item\n",
             n, rounds);
  const auto row = [](const char* label, const std::vector<double>& figures, const char* unit = "tensors/s") {
    fmt::print("  {:<52} {}\n", label, bench::spread_text(figures, "{:.0f}", unit));
  };
  row("cohort, 1 producer", quiet);
  row("cohort, 1 producer, two busy loops beside it", loaded);
  row("  loaded / quiet, % of the same round's", share, "%");
  row("cohort, 2 producers", two);
  row("cohort, 4 producers", four);
  row("cohort, 1 producer, all three stages on one CPU", one_cpu);
  row("  one CPU / two, % of the same round's", of_two_cpus, "%");
  // Where the time goes: with two CPUs, the producer and the summer share
  // one between them while the relay has the other, or near enough.
  const char* const stages[] = {"producer", "relay", "summer"};
  for (int mode = 0; mode < 2; ++mode) {
    fmt::print("  CPU time per tensor, each stage's process, {}:\n", mode == 0 ? "1 producer (on two CPUs)" : "on one CPU");
    for (int stage = 0; stage < 3; ++stage) {
      row(fmt::format("    {}", stages[stage]).c_str(), cpu[mode][stage], "ns");
    }
  }
  if (handover.empty()) {
    fmt::print("  {:<52} not measured (one CPU allowed, or it failed)\n", "a cache line handed between two CPUs");
  } else {
    row("a cache line handed between two CPUs, one way", handover, "ns");
    row("  the stages' CPU per tensor, two CPUs above one,", surplus_in_handovers, "hand-overs");
  }
  row("cohort, plain int64 values through the same queues", ints, "values/s");
  if (ring_failed) {
    fmt::print("  {:<52} failed\n", "the machine's raw ring (machine_limits --ring)");
  } else {
    fmt::print("  the machine's raw ring (machine_limits --ring {}), in the same rounds, timed from its stages'\n"
               "  start to their end\n",
               ring_items);
    row("  quiet", ring_quiet, "items/s");
    row("  two busy loops beside it", ring_loaded, "items/s");
    row("  cohort quiet, % of the raw ring's, round by round", of_ring_quiet, "%");
    row("  cohort loaded, % of the raw ring's, round by round", of_ring_loaded, "%");
  }
}

int run(int argc, char** argv);

}  // namespace bench_tensors

// A failure is printed on stderr after the sections measured before it;
// the peers' processes are ended and their files removed on the way out.
int main(int argc, char** argv) {
  if (auto rc = cohort::child_main(argc, argv)) return *rc;
  // A peer or process that died fails the next write to it with EPIPE, not
  // this process.
  std::signal(SIGPIPE, SIG_IGN);
  return cohort::bench::run_reporting("tensor_sharing", [&] { return bench_tensors::run(argc, argv); });
}

int bench_tensors::run(int argc, char** argv) {
  const bool pipeline_only = argc > 1 && std::string_view(argv[1]) == "--pipeline";
  if (pipeline_only) {
    --argc;
    ++argv;
  }
  std::vector<int> counts{100000, 3, 10};
  const char* const usage = "tensor_sharing [--pipeline] [pipeline tensors = 100000] [rounds = 3] [sends per size = 10]";
  if (const auto rc = bench::read_counts(argc, argv, usage, counts)) return *rc;
  // At least two items a producer, for up to 4 producers: their first
  // ones pass before the window opens (pipeline_stage).
  const int n = std::max(8, counts[0]);
  const int rounds = counts[1];
  const int sends = counts[2];
  const int python_ints = std::min(n, 100000), torch_tensors = std::min(n, 2000);
  const int trips = 20000, torch_trips = 300;
  const std::vector<std::size_t> sizes{std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{256} << 20,
                                       std::size_t{1} << 30};
  // The baselines' processes start before cohort's first round and take
  // their turns in every round; --pipeline runs none.
  std::optional<peers> baselines;
  if (!pipeline_only) {
    baselines.emplace();
    baselines->python_ints = python_ints;
    baselines->torch_tensors = torch_tensors;
    baselines->torch_trips = torch_trips;
  }
  pipeline_section(n, rounds, baselines ? &*baselines : nullptr);
  if (pipeline_only) return 0;
  auto& theirs = *baselines;

  // Each round: cohort's blocking and awaited ping-pong, and torch's, in
  // turns; each side's percentiles are over all its rounds' trips.
  std::vector<double> blocking, awaited;
  for (int r = 0; r < rounds; ++r) {
    double blocking_p50 = 0;
    bool answered = false;
    bench::in_turns(
        r,
        [&] {
          const auto b = ping_pong(trips, false);
          blocking_p50 = bench::percentile(b, 50);
          blocking.insert(blocking.end(), b.begin(), b.end());
          const auto a = ping_pong(trips, true);
          awaited.insert(awaited.end(), a.begin(), a.end());
        },
        [&] {
          answered = theirs.pingpong.ask(theirs.torch, fmt::format("torch_pingpong {}", torch_trips),
                                         static_cast<std::size_t>(torch_trips));
        });
    if (answered) theirs.pingpong_ratio.push_back(bench::percentile(theirs.pingpong.rounds.back(), 50) / blocking_p50);
  }
  fmt::print("ping-pong of one small shared tensor, one way (half a round trip), percentiles of all {} rounds' "
             "trips\n",
             rounds);
  const auto pingpong_row = [](const std::string& label, const std::vector<double>& samples) {
    fmt::print("  {:<52} p50 {:>7.2f} µs  p99 {:>7.2f} µs\n", label, bench::percentile(samples, 50),
               bench::percentile(samples, 99));
  };
  pingpong_row(fmt::format("cohort blocking put/get ({} trips a round)", trips), blocking);
  pingpong_row(fmt::format("cohort co_await push/pop ({} trips a round)", trips), awaited);

  // Each round: at each size, cohort's sends and torch's in turns; each
  // side's median is over all its rounds' sends.
  std::map<std::size_t, std::vector<double>> ours_shared, ours_private;
  for (int r = 0; r < rounds; ++r) {
    for (const bool shared : {true, false}) {
      for (auto size : sizes) {
        double ours_ms = 0;
        bool answered = false;
        auto& figures = (shared ? theirs.shared : theirs.priv)[size];
        bench::in_turns(
            r,
            [&] {
              const auto samples = send_cost(size, shared, sends);
              ours_ms = bench::median(samples);
              auto& pool = (shared ? ours_shared : ours_private)[size];
              pool.insert(pool.end(), samples.begin(), samples.end());
            },
            [&] {
              answered = figures.ask(theirs.torch,
                                     fmt::format("torch_send_{} {} {}", shared ? "shared" : "private", size, sends),
                                     static_cast<std::size_t>(sends));
            });
        if (answered) {
          (shared ? theirs.shared_ratio : theirs.private_ratio)[size].push_back(
              bench::median(figures.rounds.back()) / ours_ms);
        }
      }
    }
  }
  fmt::print("sending one uint8 tensor, put until the receiver has sent it back, median of {} sends ({} rounds "
             "of {})\n",
             sends * rounds, rounds, sends);
  fmt::print("  already in shared memory\n");
  for (auto size : sizes) fmt::print("    cohort {:>12} bytes {:>10.3f} ms\n", size, bench::median(ours_shared[size]));
  fmt::print("  private, a fresh tensor each send, copied into shared memory by the put\n");
  for (auto size : sizes) fmt::print("    cohort {:>12} bytes {:>10.3f} ms\n", size, bench::median(ours_private[size]));

  fmt::print("baselines in python3, measured the same way, in turns with cohort's in every round (cohort Nx: cohort\n"
             "is N times faster, the median of the rounds' ratios, their range in brackets)\n");
  // "median (min-max)" of the rounds' ratios.
  const auto ratio_text = [](const std::vector<double>& ratios, const char* format) {
    const auto s = bench::spread_of(ratios);
    const auto number = [format](double v) { return fmt::format(fmt::runtime(format), v); };
    return fmt::format("{}x ({}-{}x)", number(s.median), number(s.min), number(s.max));
  };
  // True where `figures` has every round; else prints `label` as failed.
  const auto answered_all = [rounds](const peer_figures& figures, std::string_view label) {
    if (figures.failure.empty() && figures.rounds.size() == static_cast<std::size_t>(rounds)) return true;
    fmt::print("    {:<50} failed ({})\n", label, figures.failure.empty() ? "no result" : figures.failure);
    return false;
  };
  fmt::print("  pipeline, the same window\n");
  // Like against like: Python's ints against cohort's int64 values,
  // torch's tensors against cohort's tensors.
  const auto pipeline_peer = [&](const peer_figures& figures, const std::vector<double>& ratios,
                                 const std::string& label, std::string_view unit) {
    if (answered_all(figures, label)) {
      fmt::print("    {:<50} {:>12.0f} {:<9} cohort {}\n", label, bench::median(figures.firsts()), unit,
                 ratio_text(ratios, "{:.1f}"));
    }
  };
  pipeline_peer(theirs.ints, theirs.ints_ratio, fmt::format("Python multiprocessing, plain ints ({})", python_ints),
                "items/s");
  pipeline_peer(theirs.pipeline, theirs.pipeline_ratio,
                fmt::format("torch.multiprocessing ({} tensors)", torch_tensors), "tensors/s");
  fmt::print("  ping-pong\n");
  const auto pingpong_label = fmt::format("torch.multiprocessing put/get ({} trips a round)", torch_trips);
  if (answered_all(theirs.pingpong, pingpong_label)) {
    const auto all = theirs.pingpong.pooled();
    fmt::print("    {:<50} p50 {:>7.2f} µs  p99 {:>7.2f} µs  cohort blocking p50 {}\n", pingpong_label,
               bench::percentile(all, 50), bench::percentile(all, 99), ratio_text(theirs.pingpong_ratio, "{:.0f}"));
  }
  const auto send_peers = [&](std::string_view title, const std::map<std::size_t, peer_figures>& figures,
                              const std::map<std::size_t, std::vector<double>>& ratios,
                              const std::map<std::size_t, std::vector<double>>& ours) {
    fmt::print("  {}\n", title);
    for (auto size : sizes) {
      const auto label = fmt::format("torch  {:>12} bytes", size);
      if (answered_all(figures.at(size), label)) {
        fmt::print("    {} {:>10.3f} ms   cohort {:>10.3f} ms   cohort {}\n", label,
                   bench::median(figures.at(size).pooled()), bench::median(ours.at(size)),
                   ratio_text(ratios.at(size), "{:.1f}"));
      }
    }
  };
  send_peers("send, both already in shared memory (torch: share_memory_() before the clock starts)", theirs.shared,
             theirs.shared_ratio, ours_shared);
  send_peers("send, both private (each put copies a fresh tensor into shared memory)", theirs.priv,
             theirs.private_ratio, ours_private);
  return 0;
}
