// The pool of launching threads.
#include "process/parallel.hpp"

#include "os/descriptor_limit.hpp"
#include "os/per_process.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace cohort::detail {
namespace {

// Whether this thread is one of a launch_pool's.
thread_local bool lasting = false;

// Threads that wait for work and never end. Never destroyed: threads may
// still wait on it at exit. A forked child finds a copy whose threads it
// does not have: it makes a pool of its own (os::of_this_process).
class launch_pool {
 public:
  // Adds threads until there are `count`; false when one cannot be made.
  bool grow(unsigned count) {
    std::lock_guard lock(mutex_);
    // Signals go to the process's other threads, never to these.
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    bool made = true;
    try {
      while (threads_ < count) {
        std::thread([this] { serve(); }).detach();
        ++threads_;
      }
    } catch (const std::system_error&) {
      made = false;
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return made;
  }

  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
  }

 private:
  [[noreturn]] void serve() {
    lasting = true;
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  unsigned threads_ = 0;
};

}  // namespace

unsigned start_threads(unsigned threads, std::size_t count) {
  // One launch needs no count of the CPUs (a read of /sys, 8-19 us in a
  // fresh process).
  if (count <= 1) return 1;
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  return static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(count, 1)));
}

void for_each_parallel(std::size_t count, unsigned threads, const std::function<void(std::size_t)>& fn) {
  std::vector<std::exception_ptr> errors(count);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  const auto work = [&] {
    for (std::size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < count;) {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };
  unsigned helpers = threads > 1 ? threads - 1 : 0;
  auto& pool = os::of_this_process<launch_pool>();
  if (helpers > 0 && !pool.grow(helpers)) helpers = 0;  // no thread to spare: the caller does it all
  // Each job's end is awaited, also of jobs that find no index left: they
  // use this frame.
  std::mutex mutex;
  std::condition_variable all_done;
  unsigned running = helpers;
  for (unsigned t = 0; t < helpers; ++t) {
    pool.post([&] {
      work();
      std::lock_guard lock(mutex);
      if (--running == 0) all_done.notify_one();
    });
  }
  work();
  {
    std::unique_lock lock(mutex);
    all_done.wait(lock, [&] { return running == 0; });
  }
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

void run_on_lasting_thread(const std::function<void()>& fn) {
  if (lasting) return fn();
  auto& pool = os::of_this_process<launch_pool>();
  if (!pool.grow(1)) {
    throw std::system_error(EAGAIN, std::generic_category(),
                            "cohort: a thread to start a process from" + os::process_limit_note(EAGAIN));
  }
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  pool.post([&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lock(mutex);
    done = true;
    finished.notify_one();
  });
  std::unique_lock lock(mutex);
  finished.wait(lock, [&] { return done; });
  if (error) std::rethrow_exception(error);
}

}  // namespace cohort::detail
