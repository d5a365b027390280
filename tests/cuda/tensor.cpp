// torch's CUDA cases of test/test_multiprocessing.py, ported to device
// tensors that cross through queues and as arguments; each under spawn and
// forkserver (fork is refused after CUDA: tests/cuda/device.cpp). Every
// case checks that the device's memory is back where it started.
#include "cohort/cuda/tensor.hpp"

#include "cohort/cuda/device.hpp"
#include "cohort/cuda/error.hpp"
#include "cohort/process_error.hpp"
#include "cohort/queue.hpp"
#include "cohort/spawn_and_join.hpp"
#include "cuda/exchange.hpp"

#include "support/cuda_kernels.hpp"
#include "support/cuda_memory.hpp"
#include "support/cuda_records.hpp"
#include "support/harness.hpp"
#include "support/join_by.hpp"
#include "support/process_probe.hpp"
#include "support/run_group.hpp"

#include <doctest/doctest.h>

#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <cudaTypedefs.h>

#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <stdexcept>
#include <thread>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

using namespace cohort;

const test::needs_device needs{"CUDA device", [] { return cuda::unavailable_reason(); }};

namespace cuda_tensor_tests {

const start_method methods[] = {start_method::spawn, start_method::forkserver};

// The float32 elements of a device tensor, copied here.
std::vector<float> floats_of(const tensor& t) {
  const tensor host = cuda::to_cpu(t).contiguous();
  const auto values = host.data<float>();
  return {values.begin(), values.end()};
}

// In a rank: fills the tensor it was given with `value`, on the device.
void fill_given(int, tensor t, double value) {
  if (t.device().type != kDLCUDA || !t.is_shared()) throw std::logic_error("not a device tensor");
  cuda::fill_(t, value);
  cuda::synchronize(t.device().id);
}
COHORT_ENTRYPOINT(fill_given);

// The value of the i-th tensor sent: sums of up to 2^24 stay exact in float32.
float value_of(int i) { return static_cast<float>(i % 128); }

// Ranks 0, 1, 2: producer, relay, consumer (torch's test_cuda_send_many).
// The producer sends `count` tensors of five float32 elements, the i-th
// full of value_of(i), dropping each at once; the relay sends on a clone of each; the
// consumer adds them all up on the device and returns the five sums.
std::vector<float> send_many(int rank, queue<tensor> first, queue<tensor> second, int count) {
  if (rank == 0) {
    for (int i = 0; i < count; ++i) first.put(cuda::full({5}, value_of(i), dtype::float32, 0));
  } else if (rank == 1) {
    for (int i = 0; i < count; ++i) second.put(cuda::clone(*first.get()));
  } else {
    tensor sum = cuda::zeros({5}, dtype::float32, 0);
    for (int i = 0; i < count; ++i) {
      const tensor t = *second.get();
      test::kernels::get().add_f32(sum.raw_data(), t.raw_data(), 5, cuda::current_stream());
    }
    return floats_of(sum);
  }
  return {};
}
COHORT_ENTRYPOINT(send_many);

// Rank 0 sends `count` tensors of `elements` float32 elements, the i-th
// full of i, all at once in one message; rank 1 returns, for each, whether
// it holds i, then the span of device addresses they lie in.
std::vector<std::int64_t> small_tensors(int rank, queue<std::vector<tensor>> q, int count, int elements) {
  if (rank == 0) {
    std::vector<tensor> all;
    for (int i = 0; i < count; ++i) all.push_back(cuda::full({elements}, i, dtype::float32, 0));
    q.put(all);
    return {};
  }
  const auto all = *q.get();
  std::vector<std::int64_t> out;
  auto low = reinterpret_cast<std::uintptr_t>(all.at(0).raw_data());
  auto high = low;
  for (int i = 0; i < count; ++i) {
    const auto values = floats_of(all[static_cast<std::size_t>(i)]);
    out.push_back(std::all_of(values.begin(), values.end(), [i](float v) { return v == static_cast<float>(i); }));
    const auto at = reinterpret_cast<std::uintptr_t>(all[static_cast<std::size_t>(i)].raw_data());
    low = std::min(low, at);
    high = std::max(high, at);
  }
  out.push_back(static_cast<std::int64_t>(high - low));
  return out;
}
COHORT_ENTRYPOINT(small_tensors);

// Rank 0 writes 42 to a tensor's `n` words with a kernel that first waits
// `ns` on the device, and sends it at once, long before the kernel is done;
// rank 1 returns the words that are not 42 when it copies it out. Only the
// wait on the sender's event, queued on the receiver's stream, makes them 0.
std::int64_t stream_ordered(int rank, queue<tensor> q, std::int64_t n, std::int64_t ns) {
  if (rank == 0) {
    tensor t = cuda::zeros({n}, dtype::uint32, 0);
    test::kernels::get().spin_fill(t.raw_data(), static_cast<std::uint32_t>(n), 42, static_cast<std::uint64_t>(ns),
                                   cuda::current_stream());
    q.put(t);
    return 0;
  }
  const tensor host = cuda::to_cpu(*q.get());
  const auto words = host.data<std::uint32_t>();
  return std::count_if(words.begin(), words.end(), [](std::uint32_t w) { return w != 42; });
}
COHORT_ENTRYPOINT(stream_ordered);

// Rank 0 sends `count` tensors of `bytes` bytes through a queue of one,
// dropping each as it goes, then returns how much device memory the device
// lost meanwhile (after rank 1 said it had set CUDA up); rank 1 checks each.
std::int64_t blocks_come_back(int rank, queue<tensor> q, queue<int> ready, int count, std::int64_t bytes) {
  const std::int64_t elements = bytes / 4;
  if (rank == 1) {
    cuda::synchronize(0);  // CUDA set up here before the producer measures
    ready.put(1);
    std::int64_t wrong = 0;
    for (int i = 0; i < count; ++i) {
      const tensor t = *q.get();
      const auto first = floats_of(t.slice(0, 0, 1));
      wrong += first.at(0) != static_cast<float>(i);
    }
    return wrong;
  }
  cuda::synchronize(0);
  ready.get();
  const auto before = cuda::device_memory(0).free;
  for (int i = 0; i < count; ++i) q.put(cuda::full({elements}, i, dtype::float32, 0));
  const auto after = cuda::device_memory(0).free;
  return before > after ? static_cast<std::int64_t>(before - after) : 0;
}
COHORT_ENTRYPOINT(blocks_come_back);

// Rank 0 sends a CPU tensor, a device tensor, an empty device tensor and a
// number in one message; rank 1 returns what it found in them.
using mixed = std::tuple<tensor, tensor, tensor, std::int64_t>;
std::vector<std::int64_t> mixed_values(int rank, queue<mixed> q) {
  if (rank == 0) {
    const auto host = tensor::full({3}, 7, dtype::int64);
    const mixed value{host, cuda::full({4}, 9, dtype::int64, 0), cuda::empty({0, 3}, dtype::float32, 0), 11};
    q.put(value);
    return {};
  }
  const auto [host, device, none, number] = *q.get();
  const tensor copied = cuda::to_cpu(device);
  return {static_cast<std::int64_t>(host.device().type), host.data<std::int64_t>()[2],
          static_cast<std::int64_t>(device.device().type), copied.data<std::int64_t>()[3],
          static_cast<std::int64_t>(none.device().type), none.numel(), none.shape()[1], none.to_cpu().numel(),
          number};
}
COHORT_ENTRYPOINT(mixed_values);

// In a rank that sees no device, sent a device tensor and then a CPU one:
// returns the first's error and the second's first element.
std::string no_device_here(int, queue<tensor> q) {
  std::string error;
  try {
    q.get();
    error = "received";
  } catch (const std::exception& e) {
    error = e.what();
  }
  return fmt::format("{}|{}", error, q.get()->data<float>()[0]);
}
COHORT_ENTRYPOINT(no_device_here);

// In a rank: returns the elements of the tensor it receives, copied to
// device `to` first.
std::vector<float> received_copied_to(int, queue<tensor> q, int to) { return floats_of(q.get()->to(device{kDLCUDA, to})); }
COHORT_ENTRYPOINT(received_copied_to);

// Whether device `device`'s primary context is active in this process
// (cuDevicePrimaryCtxGetState), asked through the runtime as the layer asks.
bool primary_context_active(int device) {
  const auto resolve = [](const char* symbol, unsigned version, auto& slot) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    test::cuda_check(cudaGetDriverEntryPointByVersion(symbol, &function, version, cudaEnableDefault, &found), symbol);
    if (found != cudaDriverEntryPointSuccess || function == nullptr) throw std::runtime_error(symbol);
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(function);
  };
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 get_state = nullptr;
  resolve("cuDeviceGet", 2000, device_get);
  resolve("cuDevicePrimaryCtxGetState", 7000, get_state);
  CUdevice handle = 0;
  unsigned flags = 0;
  int active = 0;
  if (device_get(&handle, device) != CUDA_SUCCESS || get_state(handle, &flags, &active) != CUDA_SUCCESS) {
    throw std::runtime_error("cuDevicePrimaryCtxGetState");
  }
  return active != 0;
}

// A host function that holds its stream up for a fifth of a second.
void CUDART_CB hold_a_fifth(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

// Holds `stream`, of device 1, up for a fifth of a second, from a thread of
// its own: this one keeps no context current, as a program that uses only
// the layer's calls has none.
void hold_up(cudaStream_t stream) {
  std::thread([stream] {
    test::cuda_check(cudaSetDevice(1), "cudaSetDevice");
    test::cuda_check(cudaLaunchHostFunc(stream, hold_a_fifth, nullptr), "cudaLaunchHostFunc");
  }).join();
}

// In a rank given only device 1's work: receives a tensor of device 1 on a
// stream held up a while (so that its release, and waits on events, go to
// the polling thread), copies it out, queries, waits on and co_awaits
// events of device 1, lets the tensor go and waits for its release. Returns
// whether device 0's primary context was made here, and the tensor's elements.
std::pair<bool, std::vector<float>> device_one_only(int, queue<tensor> q) {
  ::alarm(60);
  cudaStream_t stream = nullptr;
  std::thread([&stream] {
    test::cuda_check(cudaSetDevice(1), "cudaSetDevice");
    test::cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }).join();
  hold_up(stream);
  cuda::set_current_stream(stream);
  std::vector<float> values;
  {
    const tensor t = *q.get();
    cuda::event marked(1);
    marked.record(stream);
    if (marked.query()) throw std::logic_error("the held-up stream's event is done at once");
    auto watched = marked.async_wait(asio::use_future);
    values = floats_of(t);
    watched.get();
    marked.synchronize();
    hold_up(stream);
  }
  // The release queued behind the hold is the poller's; this wait's event
  // is recorded after it, so the release is seen done first.
  cuda::async_synchronize(1, asio::use_future).get();
  cuda::set_current_stream(nullptr);
  return {primary_context_active(0), values};
}
COHORT_ENTRYPOINT(device_one_only);

// In a rank: takes `count` tensors and is killed holding them.
void hold_and_die(int, queue<tensor> q, int count) {
  std::vector<tensor> held;
  for (int i = 0; i < count; ++i) held.push_back(*q.get());
  cuda::synchronize(0);
  ::raise(SIGKILL);
}
COHORT_ENTRYPOINT(hold_and_die);

// In a rank: sends a tensor that a kernel taking `ns` fills, long before
// the kernel is done, and is killed once the receiver has it.
void send_and_die(int, queue<tensor> q, queue<int> got, queue<std::int64_t> pid, std::int64_t ns) {
  pid.put(::getpid());
  tensor t = cuda::zeros({1024}, dtype::uint32, 0);
  test::kernels::get().spin_fill(t.raw_data(), 1024, 42, static_cast<std::uint64_t>(ns), cuda::current_stream());
  q.put(t);
  got.get();
  ::raise(SIGKILL);
}
COHORT_ENTRYPOINT(send_and_die);

// In a rank: receives the tensor (its stream now waits on the sender's
// event), says so, and copies it out once the sender is gone; returns the
// milliseconds the copy took, failed or not. SIGALRM ends it after 60 s.
std::int64_t receive_from_dying(int, queue<tensor> q, queue<int> got, std::int64_t sender) {
  ::alarm(60);
  const tensor t = *q.get();
  got.put(1);
  while (::kill(static_cast<pid_t>(sender), 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)cuda::to_cpu(t);
  } catch (const std::exception&) {
    // The sender's device work may have ended with it: an error, not a hang.
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}
COHORT_ENTRYPOINT(receive_from_dying);

// In a rank: waits for the event it was given (torch's
// test_event_handle_importer); returns whether it had fired by then.
bool wait_for_given(int, cuda::event done) {
  done.synchronize();
  return done.query();
}
COHORT_ENTRYPOINT(wait_for_given);

// In a rank: records an event after a kernel that takes `ns` and sends it
// (torch's test_event_handle_exporter); ends once told, so the event
// outlives the receiver's use of it.
void export_event(int, queue<cuda::event> out, queue<int> used, std::int64_t ns) {
  tensor t = cuda::zeros({1024}, dtype::uint32, 0);
  test::kernels::get().spin_fill(t.raw_data(), 1024, 5, static_cast<std::uint64_t>(ns), cuda::current_stream());
  cuda::event done(0);
  done.record(cuda::current_stream());
  out.put(done);
  used.get();
}
COHORT_ENTRYPOINT(export_event);

// Ranks 0 and 1: rank 0 passes on the event it receives; rank 1 makes its
// stream wait on the event passed on, then returns the words of `t` that
// are not 42 (sent before the kernel that writes them was queued, so only
// the event orders the copy after that kernel).
std::int64_t relay_event(int rank, queue<tensor> data, queue<cuda::event> first, queue<cuda::event> second) {
  ::alarm(60);
  if (rank == 0) {
    const cuda::event opened = *first.get();
    if (!opened.opened()) throw std::logic_error("the event is not opened here");
    second.put(opened);
    return 0;
  }
  const tensor t = *data.get();
  const cuda::event passed_on = *second.get();
  passed_on.wait(cuda::current_stream());
  const tensor host = cuda::to_cpu(t);
  const auto words = host.data<std::uint32_t>();
  return std::count_if(words.begin(), words.end(), [](std::uint32_t w) { return w != 42; });
}
COHORT_ENTRYPOINT(relay_event);

// Ranks 0, 1, 2: maker, relay, receiver. The maker sends a tensor of a
// chunk of its own (2 MiB) full of 7 and ends; the relay sends it on and
// drops it, and once the maker has ended maps a chunk of the receiver's
// (which sweeps the chunks it no longer uses) before the receiver takes the
// tensor, which it can then have only through the relay. The receiver
// returns whether every element is 7. SIGALRM ends a rank after 60 s.
// Waits for process `pid` to end; throws if it still runs after 15 s (a
// rank's end waits at most 30 s for its messages to be received).
void wait_until_ended(pid_t pid, const char* who) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (::kill(pid, 0) == 0) {
    if (std::chrono::steady_clock::now() > until) throw std::runtime_error(fmt::format("{} still runs after 15 s", who));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Rank 0 sends two device tensors in one value and ends; rank 1, which
// sees no device, refuses the first (the second is never reached) and
// returns why once rank 0 has ended.
std::string refused_by_a_rank(int rank, queue<std::vector<tensor>> q, queue<std::int64_t> sender) {
  ::alarm(60);
  if (rank == 0) {
    sender.put(::getpid());
    const std::vector<tensor> both{cuda::full({2}, 1.0, dtype::float32, 0), cuda::full({3}, 2.0, dtype::float32, 0)};
    q.put(both);
    return "sent";
  }
  const auto pid = static_cast<pid_t>(*sender.get());
  std::string why = "received";
  try {
    (void)q.get();
  } catch (const std::exception& e) {
    why = e.what();
  }
  wait_until_ended(pid, "the sender");
  return why;
}
COHORT_ENTRYPOINT(refused_by_a_rank);

// In a rank: sends one device tensor.
void send_one(int, queue<tensor> q) { q.put(cuda::full({4}, 3.0, dtype::float32, 0)); }
COHORT_ENTRYPOINT(send_one);

// How many senders' event tables this process maps (by their memfd's name).
int event_tables_mapped() { return test::mappings_naming("cohort-cuda-events"); }

bool relay_after_maker(int rank, queue<tensor> to_relay, queue<tensor> on, queue<tensor> back,
                       queue<std::int64_t> maker, queue<int> go) {
  ::alarm(60);
  if (rank == 0) {
    maker.put(::getpid());
    to_relay.put(cuda::full({1 << 19}, 7.0, dtype::float32, 0));
    return false;
  }
  if (rank == 1) {
    const auto pid = static_cast<pid_t>(*maker.get());
    on.put(*to_relay.get());
    // The maker ends once this rank has its tensor: it does not wait for
    // the message sent on.
    wait_until_ended(pid, "the maker");
    (void)*back.get();
    go.put(1);
    return false;
  }
  back.put(cuda::full({4}, 1.0, dtype::float32, 0));
  (void)go.get();
  const auto values = floats_of(*on.get());
  return std::all_of(values.begin(), values.end(), [](float v) { return v == 7.0f; });
}
COHORT_ENTRYPOINT(relay_after_maker);

}  // namespace cuda_tensor_tests

using namespace cuda_tensor_tests;

TEST_SUITE("cuda tensors") {
  TEST_CASE("a device tensor is shared, prints without reading the device, and refuses host access") {
    const test::memory_mark mark(0);
    {
      tensor t = cuda::full({2, 3}, 1.5, dtype::float32, 0);
      CHECK(t.is_shared());
      CHECK(t.device() == device{kDLCUDA, 0});
      CHECK(to_string(t) == "tensor(<6 elements on device 2:0>, shape=[2, 3], dtype=float32)");
      CHECK_THROWS_AS(t.data<float>(), std::logic_error);
      CHECK_THROWS_AS((void)(t == t), std::logic_error);
      CHECK(floats_of(t) == std::vector<float>(6, 1.5f));
      const tensor back = cuda::to_device(tensor::full({4}, 3, dtype::int64), 0);
      const tensor host = cuda::to_cpu(back);
      CHECK(host == tensor::full({4}, 3, dtype::int64));
      // The members reach the same copies through the core library.
      const tensor copy = t.clone();
      CHECK(copy.device() == device{kDLCUDA, 0});
      CHECK(!copy.storage().same(t.storage()));
      CHECK(floats_of(copy) == std::vector<float>(6, 1.5f));
      CHECK(t.to(device{kDLCUDA, 0}).storage().same(t.storage()));
      const tensor moved = tensor::full({3}, 2, dtype::int32).to(device{kDLCUDA, 0});
      CHECK(moved.device() == device{kDLCUDA, 0});
      CHECK(moved.to_cpu() == tensor::full({3}, 2, dtype::int32));
      // 8-byte elements are filled as two words each.
      const tensor wide = cuda::full({3}, -2.25, dtype::float64, 0);
      CHECK(cuda::to_cpu(wide) == tensor::full({3}, -2.25, dtype::float64));
      const tensor none = cuda::zeros({0, 4}, dtype::float32, 0);
      CHECK(none.numel() == 0);
      CHECK(cuda::to_cpu(none).numel() == 0);
    }
    cuda::empty_cache();
    CHECK(mark.given_back());
  }

  TEST_CASE("a device tensor given to a rank is the same memory: the rank's writes are seen here (test_cuda_simple)") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      const test::memory_mark mark(0);
      {
        tensor t = cuda::zeros({5}, dtype::float32, 0);
        spawn_and_join(fill_given, std::tuple{t, 7.0}, 1, test::join_by(method));
        CHECK(floats_of(t) == std::vector<float>(5, 7.0f));
      }
      cuda::empty_cache();
      CHECK(mark.given_back());
    }
  }

  TEST_CASE("many tensors go producer -> relay (clone) -> consumer through queues (test_cuda_send_many, ipc_deadlock)") {
    for (auto method : methods) {
      // A queue of one keeps them in step; one of 1024 lets the producer
      // run far ahead, over many chunks, recording its events again and
      // again while receivers still wait on them.
      for (auto [capacity, count] : {std::pair{std::size_t{1}, 2000}, std::pair{std::size_t{1024}, 20000}}) {
        CAPTURE(to_string(method));
        CAPTURE(capacity);
        const test::memory_mark mark(0);
        queue<tensor> first(capacity), second(capacity);
        const auto results = spawn_and_join(send_many, std::tuple{first, second, count}, 3, test::join_by(method));
        float expected = 0;
        for (int i = 0; i < count; ++i) expected += value_of(i);
        CHECK(results.at(2) == std::vector<float>(5, expected));
        CHECK(mark.given_back());
      }
    }
  }

  TEST_CASE("many small tensors share a chunk, each arriving whole (test_cuda_small_tensors)") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      const test::memory_mark mark(0);
      constexpr int count = 500;
      queue<std::vector<tensor>> q(4);
      const auto results = spawn_and_join(small_tensors, std::tuple{q, count, 5}, 2, test::join_by(method));
      const auto& seen = results.at(1);
      REQUIRE(seen.size() == count + 1);
      CHECK(std::count(seen.begin(), seen.end() - 1, 1) == count);
      // 500 blocks of 512 bytes: one 2 MiB chunk holds them all.
      CHECK(seen.back() < (std::int64_t{2} << 20));
      CHECK(mark.given_back());
    }
  }

  TEST_CASE("a receiver's stream waits for the sender's kernel: it never reads before the kernel wrote") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      queue<tensor> q(4);
      constexpr std::int64_t n = 1 << 16;
      constexpr std::int64_t half_a_second = 500'000'000;
      const auto results = spawn_and_join(stream_ordered, std::tuple{q, n, half_a_second}, 2, test::join_by(method));
      CHECK(results.at(1) == 0);
    }
  }

  TEST_CASE("a producer that drops each tensor as it sends reuses the blocks its receiver has let go of "
            "(test_cuda_memory_allocation)") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      const test::memory_mark mark(0);
      queue<tensor> q(2);
      queue<int> ready(1);
      constexpr int count = 1000;
      constexpr std::int64_t bytes = 256 << 10;  // 250 MiB in all, were no block reused
      const auto results =
          spawn_and_join(blocks_come_back, std::tuple{q, ready, count, bytes}, 2, test::join_by(method));
      CHECK(results.at(1) == 0);
      CHECK(results.at(0) < (std::int64_t{64} << 20));
      CHECK(mark.given_back());
    }
  }

  TEST_CASE("CPU, device and empty device tensors cross in one message") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      queue<mixed> q(2);
      const auto results = spawn_and_join(mixed_values, std::tuple{q}, 2, test::join_by(method));
      CHECK(results.at(1) == std::vector<std::int64_t>{kDLCPU, 7, kDLCUDA, 9, kDLCUDA, 0, 3, 0, 11});
    }
  }

  TEST_CASE("a receiver that does not see the device says so, and goes on receiving") {
    queue<tensor> q(4);
    const tensor on_device = cuda::full({2}, 1, dtype::float32, 0);
    const tensor on_host = tensor::full({2}, 5, dtype::float32);
    q.put(on_device);
    q.put(on_host);
    join_options options;
    // CUDA_VISIBLE_DEVICES is read as CUDA starts in the rank.
    options.spawn.env.set("CUDA_VISIBLE_DEVICES", "-1");
    const auto results = spawn_and_join(no_device_here, std::tuple{q}, 1, options);
    const auto& said = results.at(0);
    CAPTURE(said);
    CHECK(said.find("no CUDA device") != std::string::npos);
    CHECK(said.ends_with("|5"));
  }

  TEST_CASE("a rank whose device tensors a receiver refused ends without waiting for them") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      queue<std::vector<tensor>> q(2);
      queue<std::int64_t> sender(1);
      group_spec spec;
      spec.entry = call(method, refused_by_a_rank, q, sender);
      spec.nprocs = 2;
      spec.envs = {{0, {}}, {1, {{"CUDA_VISIBLE_DEVICES", "-1"}}}};
      const auto result = test::run_group(spec);
      std::string failures;
      for (const auto& f : result.failures) failures += fmt::format("rank {}: {}; ", f.rank, f.message);
      CAPTURE(failures);
      REQUIRE(result.ok());
      const auto why = decode<std::string>(*result.return_values.at(1));
      CAPTURE(why);
      CHECK(why.find("no CUDA device") != std::string::npos);
    }
  }

  TEST_CASE("a record naming a chunk, a sender or a device that is not there is refused, and the receiver goes on") {
    // (tests/cuda/record.cpp: what is refused before a device is asked.)
    const test::memory_mark mark(0);
    {
      using test::made_up_record;
      const auto here = cuda::device_uuid(0).bytes;
      // A chunk this process never made.
      const auto own = made_up_record::block_of(std::uint64_t{1} << 62, here);
      CHECK_THROWS_WITH_AS((void)own.receive(), doctest::Contains("of this process, which it has freed"), decode_error);
      // A chunk of a process that serves none (the one that runs this test).
      auto remote = made_up_record::block_of(5, here);
      remote.note.maker = remote.sender = static_cast<std::uint32_t>(::getppid());
      remote.note.maker_port = remote.port = 12345;
      CHECK_THROWS_WITH_AS((void)remote.receive(),
                           doctest::Contains(fmt::format("chunk 5 of process {} cannot be had: from its maker", ::getppid()).c_str()),
                           decode_error);
      // A device this process does not see.
      std::array<unsigned char, 16> nowhere;
      nowhere.fill(0xee);
      const auto elsewhere = made_up_record::block_of(5, nowhere);
      CHECK_THROWS_WITH_AS((void)elsewhere.receive(), doctest::Contains("which this process does not see"), decode_error);
      // A true record still crosses.
      const tensor t = cuda::full({4}, 2.5, dtype::float32, 0);
      const tensor back = decode<tensor>(encode(t));
      CHECK(back.storage().data() == t.storage().data());
      CHECK(floats_of(back) == std::vector<float>(4, 2.5f));
    }
    cuda::empty_cache();
    CHECK(mark.given_back());
  }

  TEST_CASE("a record whose sender is this pid on another port is an earlier process's: its event is not waited for here") {
    const tensor t = cuda::full({4}, 2.5, dtype::float32, 0);
    const auto sent = encode(t);  // held while its bytes are read back
    std::vector<std::byte> bytes(sent.bytes().begin(), sent.bytes().end());
    // The sender and its port, as the record holds them: the port made another.
    std::array<std::byte, 8> sender_and_port;
    const auto pid = static_cast<std::uint32_t>(::getpid());
    const std::uint32_t port = cuda::detail::own_port();
    std::memcpy(sender_and_port.data(), &pid, 4);
    std::memcpy(sender_and_port.data() + 4, &port, 4);
    const auto at = std::search(bytes.begin(), bytes.end(), sender_and_port.begin(), sender_and_port.end());
    REQUIRE(at != bytes.end());
    const std::uint32_t other = port + 1;
    std::memcpy(&*(at + 4), &other, 4);
    CHECK_THROWS_WITH_AS((void)decode<tensor>(encoded::from_bytes(bytes)),
                         doctest::Contains(fmt::format("the event table of a device tensor from process {}", pid).c_str()),
                         decode_error);
    // The true record still crosses.
    CHECK(floats_of(decode<tensor>(encode(t))) == std::vector<float>(4, 2.5f));
  }

  TEST_CASE("tensors and events of a second device cross as the first's do (test_event_handle_multi_gpu)") {
    if (cuda::device_count() < 2) {
      MESSAGE("fewer than two devices: nothing to check");
      return;
    }
    for (auto method : methods) {
      CAPTURE(to_string(method));
      const test::memory_mark mark(1);
      {
        // An event's handle, before and after a record, with another
        // device current.
        cuda::event first(0);
        test::cuda_check(cudaSetDevice(1), "cudaSetDevice");
        (void)first.ipc_handle();
        first.record(nullptr);
        (void)first.ipc_handle();
        test::cuda_check(cudaSetDevice(0), "cudaSetDevice");
        first.synchronize();
        // A tensor and an event of device 1, used in a rank.
        tensor t = cuda::zeros({5}, dtype::float32, 1);
        spawn_and_join(fill_given, std::tuple{t, 7.0}, 1, test::join_by(method));
        CHECK(floats_of(t) == std::vector<float>(5, 7.0f));
        cuda::event second(1);
        second.record(nullptr);
        const auto fired = spawn_and_join(wait_for_given, std::tuple{second}, 1, test::join_by(method));
        REQUIRE(fired.size() == 1);
        CHECK(fired[0]);
      }
      cuda::empty_cache();
      CHECK(mark.given_back());
    }
  }

  TEST_CASE("a receiver fed by one sender after another keeps the events and tables of live senders only") {
    const int before = event_tables_mapped();
    for (int i = 0; i < 3; ++i) {
      queue<tensor> q(1);
      const auto args = std::tuple{q};
      auto sender = std::async(std::launch::async, [&] { spawn_and_join(send_one, args, 1); });
      const tensor t = *q.get();
      CHECK(floats_of(t) == std::vector<float>(4, 3.0f));
      sender.get();
    }
    // The last sender's stays until a later sender's first message.
    CHECK(event_tables_mapped() - before == 1);
  }

  TEST_CASE("a relay keeps a tensor it sent on mapped until it is received, its maker gone") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      const test::memory_mark mark(0);
      queue<tensor> to_relay(1), on(1), back(1);
      queue<std::int64_t> maker(1);
      queue<int> go(1);
      const auto args = std::tuple{to_relay, on, back, maker, go};
      const auto results = spawn_and_join(relay_after_maker, args, 3, test::join_by(method));
      CHECK(results.at(2));
      CHECK(mark.given_back());
    }
  }

  TEST_CASE("tensor::to another device: the source's block, reused at once, is not overwritten under the copy") {
    if (cuda::device_count() < 2) {
      MESSAGE("fewer than two devices: nothing to check");
      return;
    }
    const test::memory_mark mark(1);
    {
      constexpr std::int64_t elements = 1 << 16;  // 256 KiB: a block of a shared chunk
      std::optional<tensor> copy;
      const void* at = nullptr;
      tensor busy = cuda::zeros({1024}, dtype::uint32, 0);
      {
        const tensor source = cuda::full({elements}, 3.0, dtype::float32, 1);
        cuda::synchronize(1);
        at = source.raw_data();
        // The copy waits on device 0's stream behind a kernel of 200 ms.
        test::cuda_check(cudaSetDevice(0), "cudaSetDevice");
        test::kernels::get().spin_fill(busy.raw_data(), 1024, 1, 200'000'000, cuda::current_stream());
        copy = source.to(device{kDLCUDA, 0});
      }
      const tensor reused = cuda::zeros({elements}, dtype::float32, 1);
      CHECK(reused.raw_data() == at);
      CHECK(floats_of(*copy) == std::vector<float>(elements, 3.0f));
    }
    cuda::empty_cache();
    CHECK(mark.given_back());
  }

  TEST_CASE("tensor::to another device copies a block of a shared chunk and a chunk of its own whole, there and back") {
    if (cuda::device_count() < 2) {
      MESSAGE("fewer than two devices: nothing to check");
      return;
    }
    const test::memory_mark mark(0);
    {
      // A block of a shared chunk and a larger tensor's own chunk: each
      // mapped for device 0 alone.
      const tensor small = cuda::full({1 << 10}, 4.0, dtype::float32, 0);
      const tensor large = cuda::full({1 << 20}, 5.0, dtype::float32, 0);
      const tensor small_copy = small.to(device{kDLCUDA, 1});
      const tensor large_copy = large.to(device{kDLCUDA, 1});
      CHECK(small_copy.device() == device{kDLCUDA, 1});
      CHECK(floats_of(small_copy) == std::vector<float>(1 << 10, 4.0f));
      CHECK(floats_of(large_copy) == std::vector<float>(1 << 20, 5.0f));
      // And back.
      CHECK(floats_of(small_copy.to(device{kDLCUDA, 0})) == std::vector<float>(1 << 10, 4.0f));
      // Received in a rank, whose mapping of the chunk is for device 0 alone.
      queue<tensor> q(1);
      q.put(small);
      const auto seen = spawn_and_join(received_copied_to, std::tuple{q, 1}, 1);
      CHECK(seen.at(0) == std::vector<float>(1 << 10, 4.0f));
    }
    cuda::empty_cache();
    CHECK(mark.given_back());
  }

  TEST_CASE("a rank that uses only device 1 makes no context on device 0") {
    if (cuda::device_count() < 2) {
      MESSAGE("fewer than two devices: nothing to check");
      return;
    }
    queue<tensor> q(1);
    q.put(cuda::full({256}, 6.0, dtype::float32, 1));
    const auto results = spawn_and_join(device_one_only, std::tuple{q}, 1);
    const auto& [made, values] = results.at(0);
    CHECK_FALSE(made);
    CHECK(values == std::vector<float>(256, 6.0f));
  }

  TEST_CASE("a receiver killed holding tensors gives their blocks back to the maker") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      const test::memory_mark mark(0);
      {
        queue<tensor> q(16);
        constexpr int count = 8;  // 1 MiB each: four chunks
        for (int i = 0; i < count; ++i) {
          const tensor t = cuda::full({1 << 18}, i, dtype::float32, 0);
          q.put(t);
        }
        CHECK_THROWS_AS(spawn_and_join(hold_and_die, std::tuple{q, count}, 1, test::join_by(method)),
                        process_exited_error);
      }
      // Every block is free again, so every chunk can go.
      CHECK(cuda::empty_cache() >= 4);
      CHECK(mark.given_back());
    }
  }

  TEST_CASE("a receiver whose stream waits on a sender killed before its kernel ended does not hang") {
    queue<tensor> q(2);
    queue<int> got(1);
    queue<std::int64_t> sender(1);
    constexpr std::int64_t five_seconds = 5'000'000'000;
    auto sending = std::async(std::launch::async, [&] {
      CHECK_THROWS_AS(spawn_and_join(send_and_die, std::tuple{q, got, sender, five_seconds}, 1), process_exited_error);
    });
    const std::int64_t pid = *sender.get();
    const auto took = spawn_and_join(receive_from_dying, std::tuple{q, got, pid}, 1);
    sending.get();
    CHECK(took.at(0) < 60'000);
  }

  TEST_CASE("co_await on an event or a stream: the io_context goes on meanwhile, and it ends once the work is done") {
    asio::io_context io;
    tensor t = cuda::zeros({1024}, dtype::uint32, 0);
    constexpr std::uint64_t fifth_of_a_second = 200'000'000;
    const auto ticks_while = [&](auto wait) -> asio::awaitable<std::pair<int, bool>> {
      // A timer on the same thread ticks while the wait is pending.
      int ticks = 0;
      bool waiting = true;
      asio::co_spawn(io, [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(io);
        while (waiting) {
          timer.expires_after(std::chrono::milliseconds(10));
          co_await timer.async_wait(asio::use_awaitable);
          ++ticks;
        }
      }, asio::detached);
      co_await wait();
      waiting = false;
      co_return std::pair{ticks, true};
    };
    // An event recorded after a kernel that takes a fifth of a second.
    cuda::event done(0);
    test::kernels::get().spin_fill(t.raw_data(), 1024, 7, fifth_of_a_second, cuda::current_stream());
    done.record(cuda::current_stream());
    const auto [ticks, ended] = test::run(io, ticks_while([&] { return done.async_wait(); }));
    CHECK(ended);
    CHECK(ticks >= 5);
    CHECK(done.query());
    // The current stream, the same way; then the kernel's words are there.
    test::kernels::get().spin_fill(t.raw_data(), 1024, 9, fifth_of_a_second, cuda::current_stream());
    const auto [stream_ticks, stream_ended] = test::run(io, ticks_while([] { return cuda::async_synchronize(0); }));
    CHECK(stream_ended);
    CHECK(stream_ticks >= 5);
    std::vector<std::uint32_t> words(1024);
    test::cuda_check(cudaMemcpy(words.data(), t.raw_data(), 4096, cudaMemcpyDeviceToHost), "cudaMemcpy");
    CHECK(std::all_of(words.begin(), words.end(), [](std::uint32_t w) { return w == 9; }));
    // Any token: a callback, on the io_context's thread.
    bool called = false;
    cuda::event again(0);
    again.record(cuda::current_stream());
    again.async_wait(asio::bind_executor(io, [&](std::exception_ptr error) { called = !error; }));
    io.run();
    io.restart();
    CHECK(called);
  }

  TEST_CASE("events cross as arguments and through queues (test_event_handle_importer, _exporter)") {
    for (auto method : methods) {
      CAPTURE(to_string(method));
      tensor t = cuda::zeros({1024}, dtype::uint32, 0);
      cuda::event done(0);
      test::kernels::get().spin_fill(t.raw_data(), 1024, 3, 200'000'000, cuda::current_stream());
      done.record(cuda::current_stream());
      CHECK(spawn_and_join(wait_for_given, std::tuple{done}, 1, test::join_by(method)).at(0));

      queue<cuda::event> events(1);
      queue<int> used(1);
      auto exporter = std::async(std::launch::async, [&] {
        spawn_and_join(export_event, std::tuple{events, used, std::int64_t{200'000'000}}, 1, test::join_by(method));
      });
      cuda::event theirs = *events.get();
      CHECK(theirs.opened());
      theirs.synchronize();
      CHECK(theirs.query());
      used.put(1);
      exporter.get();
    }
    // An event received and passed on still orders a third process's work
    // after the maker's kernel.
    for (auto method : methods) {
      CAPTURE(to_string(method));
      tensor t = cuda::zeros({1024}, dtype::uint32, 0);
      queue<tensor> data(1);
      queue<cuda::event> first(1), second(1);
      data.put(t);
      test::kernels::get().spin_fill(t.raw_data(), 1024, 42, 3'000'000'000, cuda::current_stream());
      cuda::event done(0);
      done.record(cuda::current_stream());
      first.put(done);
      const auto wrong = spawn_and_join(relay_event, std::tuple{data, first, second}, 2, test::join_by(method));
      CHECK(wrong.at(1) == 0);
      cuda::synchronize(0);
    }
    // The process that made an event cannot open it: received here, it is refused.
    cuda::event mine(0);
    CHECK_THROWS_AS(decode<cuda::event>(encode(mine)), decode_error);
  }
}
