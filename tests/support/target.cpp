// The program tests spawn. Its first argument names what it does:
//   exit N                 exit with code N
//   sleep SECONDS          sleep, then exit 0
//   kill-self SIG          raise SIG (a name without "SIG": KILL, SEGV, TERM...)
//   print-env NAME         print NAME's value, or "<unset>"
//   print-cwd              print the working directory
//   print-pgid             print "<pid> <pgid> <session id>"
//   print-pdeathsig        print the parent-death signal number
//   print-sigmask          print the blocked-signal mask as hex
//   print-sigpipe          print "default" or "ignored" for SIGPIPE's disposition
//   print-nofile           print the soft limit on open descriptors (RLIMIT_NOFILE)
//   print-nice             print the nice value
//   list-fds               print the open descriptors above 2, space separated
//   cat                    copy stdin to stdout until EOF
//   write FD TEXT          write TEXT to descriptor FD
//   ignore-term            ignore SIGTERM, print "ready", sleep 60
//   leave-group SECONDS    move to its parent's process group, then sleep
//   traceable SECONDS      let any process trace it (Yama), then sleep
//   burn-cpu MS            spin for MS milliseconds of CPU time
//   touch-mib N            touch N MiB of memory
//   timestamp-exit FD      write CLOCK_MONOTONIC (ns, 8 bytes) to FD, then _exit(0)
//   exit-after MS CODE     sleep MS milliseconds, then exit with CODE
//   exit-env NAME          exit with the number in environment variable NAME
//   record-error MSG [SECONDS [DELAY_MS]]
//                          write an error file (cohort::record_error) for a
//                          std::runtime_error(MSG) with trace "frame 1\nframe 2",
//                          stamped SECONDS after the epoch (default now); after
//                          DELAY_MS, exit 1
//   spawn-function METHOD  without having called child_main, run a registered
//                          function by start method METHOD (spawn, fork,
//                          forkserver); print what a std::logic_error says and
//                          exit 3, what another exception says and exit 4,
//                          or exit 0 when the function ran
//   run-function METHOD [DIR]
//                          as a program that starts functions does, calling
//                          child_main first, run 2 ranks of a function that
//                          returns its rank + 40 by start method METHOD (in
//                          DIR, moved to first, where given); print what
//                          they returned, one a line, and exit 0, or print
//                          what the failure says and exit 4
//   ignore-child-main      run a registered function by spawn from a main
//                          that calls child_main and goes on past its exit
//                          code, as the ranks' main then does too; print
//                          what the failure says and exit 3, or exit 0 when
//                          the function ran
//   leave-error-file       start a group of one rank that records an error,
//                          wait for it, fork a child that calls exit(); print
//                          the error file and 1/0 for whether it was there
//                          after the wait and after the child; exit() with
//                          the group never destroyed
//   wait-on-queue MS       get a value from a queue, blocking, then pop one on
//                          an io_context without the ring (its wait on a
//                          helper thread), each put by another thread MS
//                          milliseconds later; print each value (or what
//                          the wait threw), then the CPU and the wall
//                          milliseconds of the awaited wait
//   setsid-grandchild CODE start a grandchild that calls setsid() and sleeps 60 s,
//                          print its pid, then exit with CODE
#include <cohort/entry_point.hpp>
#include <cohort/error_file.hpp>
#include <cohort/group.hpp>
#include <cohort/io_uring_info.hpp>
#include <cohort/queue.hpp>
#include <cohort/spawn_and_join.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

void does_nothing(int) {}
COHORT_ENTRYPOINT(does_nothing);

int rank_plus_forty(int rank) { return rank + 40; }
COHORT_ENTRYPOINT(rank_plus_forty);

namespace {

int usage() {
  std::fprintf(stderr, "target: unknown command\n");
  return 100;
}

int signal_number(const char* name) {
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev != nullptr && std::strcmp(abbrev, name) == 0) return sig;
  }
  return std::atoi(name);
}

long long milliseconds_of(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return t.tv_sec * 1000LL + t.tv_nsec / 1'000'000;
}

cohort::start_method method_named(std::string_view method) {
  return method == "fork"         ? cohort::start_method::fork
         : method == "forkserver" ? cohort::start_method::forkserver
                                  : cohort::start_method::spawn;
}

}  // namespace

int main(int argc, char** argv) {
  // ignore-child-main and its ranks. A rank whose start of its own got past
  // the refusal would start more in turn: the depth stops that at a
  // grandchild, which exits 5.
  if (argc == 2 && std::string_view(argv[1]) == "ignore-child-main") ::setenv("COHORT_TEST_IGNORING", "0", 1);
  if (const char* depth = std::getenv("COHORT_TEST_IGNORING")) {
    if (std::atoi(depth) >= 2) return 5;
    ::setenv("COHORT_TEST_IGNORING", std::to_string(std::atoi(depth) + 1).c_str(), 1);
    (void)cohort::child_main(argc, argv);
    try {
      cohort::spawn_and_join(does_nothing, std::tuple{}, 1);
    } catch (const std::exception& e) {
      if (std::atoi(depth) > 0) throw;  // a rank: into its error file, for the start above to report
      std::printf("%s\n", e.what());
      return 3;
    }
    return 0;
  }
  // run-function's ranks and forkserver: this program run again.
  if (argc > 1 && std::string_view(argv[1]).starts_with("--cohort-")) {
    if (auto rc = cohort::child_main(argc, argv)) return *rc;
  }
  if (argc < 2) return usage();
  std::string what = argv[1];
  const char* arg = argc > 2 ? argv[2] : "";

  if (what == "exit") return std::atoi(arg);
  if (what == "spawn-function") {
    cohort::join_options options;
    options.method = method_named(arg);
    try {
      cohort::spawn_and_join(does_nothing, std::tuple{}, 1, options);
    } catch (const std::logic_error& e) {
      std::printf("%s\n", e.what());
      return 3;
    } catch (const std::exception& e) {
      std::printf("%s\n", e.what());
      return 4;
    }
    return 0;
  }
  if (what == "run-function") {
    (void)cohort::child_main(argc, argv);  // nothing to run here: this is the parent
    if (argc > 3 && ::chdir(argv[3]) != 0) return 5;
    cohort::join_options options;
    options.method = method_named(arg);
    try {
      for (int value : cohort::spawn_and_join(rank_plus_forty, std::tuple{}, 2, options)) std::printf("%d\n", value);
    } catch (const std::exception& e) {
      std::printf("%s\n", e.what());
      return 4;
    }
    return 0;
  }
  if (what == "sleep") {
    ::sleep(static_cast<unsigned>(std::atoi(arg)));
    return 0;
  }
  if (what == "kill-self") {
    ::raise(signal_number(arg));
    return 99;
  }
  if (what == "print-env") {
    const char* value = std::getenv(arg);
    std::printf("%s\n", value != nullptr ? value : "<unset>");
    return 0;
  }
  if (what == "print-cwd") {
    char buf[4096];
    std::printf("%s\n", ::getcwd(buf, sizeof buf));
    return 0;
  }
  if (what == "print-pgid") {
    std::printf("%d %d %d\n", ::getpid(), ::getpgid(0), ::getsid(0));
    return 0;
  }
  if (what == "print-pdeathsig") {
    int sig = 0;
    ::prctl(PR_GET_PDEATHSIG, &sig);
    std::printf("%d\n", sig);
    return 0;
  }
  if (what == "print-nofile") {
    rlimit lim{};
    ::getrlimit(RLIMIT_NOFILE, &lim);
    std::printf("%llu\n", static_cast<unsigned long long>(lim.rlim_cur));
    return 0;
  }
  if (what == "print-nice") {
    std::printf("%d\n", ::getpriority(PRIO_PROCESS, 0));
    return 0;
  }
  if (what == "print-sigmask") {
    sigset_t mask;
    ::sigprocmask(SIG_BLOCK, nullptr, &mask);
    std::uint64_t bits = 0;
    for (int sig = 1; sig <= 64; ++sig) {
      if (sigismember(&mask, sig) == 1) bits |= std::uint64_t{1} << (sig - 1);
    }
    std::printf("%llx\n", static_cast<unsigned long long>(bits));
    return 0;
  }
  if (what == "print-sigpipe") {
    struct sigaction sa {};
    ::sigaction(SIGPIPE, nullptr, &sa);
    std::printf("%s\n", sa.sa_handler == SIG_IGN ? "ignored" : "default");
    return 0;
  }
  if (what == "list-fds") {
    std::vector<int> fds;
    DIR* dir = ::opendir("/proc/self/fd");
    const int own = ::dirfd(dir);
    while (dirent* entry = ::readdir(dir)) {
      int fd = std::atoi(entry->d_name);
      if (entry->d_name[0] != '.' && fd > 2 && fd != own) fds.push_back(fd);
    }
    ::closedir(dir);
    for (std::size_t i = 0; i < fds.size(); ++i) std::printf(i ? " %d" : "%d", fds[i]);
    std::printf("\n");
    return 0;
  }
  if (what == "cat") {
    char buf[65536];
    ssize_t n;
    while ((n = ::read(0, buf, sizeof buf)) > 0) {
      if (::write(1, buf, static_cast<std::size_t>(n)) != n) return 1;
    }
    return n < 0 ? 1 : 0;
  }
  if (what == "write" && argc > 3) {
    std::size_t len = std::strlen(argv[3]);
    return ::write(std::atoi(arg), argv[3], len) == static_cast<ssize_t>(len) ? 0 : 1;
  }
  if (what == "leave-group") {
    if (::setpgid(0, ::getpgid(::getppid())) != 0) return 2;
    ::sleep(static_cast<unsigned>(std::atoi(arg)));
    return 0;
  }
  if (what == "traceable") {
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // EINVAL without Yama, where none is needed
    ::sleep(static_cast<unsigned>(std::atoi(arg)));
    return 0;
  }
  if (what == "ignore-term") {
    ::signal(SIGTERM, SIG_IGN);
    std::printf("ready\n");
    std::fflush(stdout);
    ::sleep(60);
    return 0;
  }
  if (what == "burn-cpu") {
    timespec start{}, now{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
    const long budget_ns = std::atol(arg) * 1'000'000L;
    do ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    while ((now.tv_sec - start.tv_sec) * 1'000'000'000L + (now.tv_nsec - start.tv_nsec) < budget_ns);
    return 0;
  }
  if (what == "touch-mib") {
    const std::size_t bytes = static_cast<std::size_t>(std::atol(arg)) << 20;
    auto* p = static_cast<volatile char*>(std::malloc(bytes));
    for (std::size_t i = 0; i < bytes; i += 4096) p[i] = 1;
    return 0;
  }
  if (what == "timestamp-exit") {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    std::int64_t ns = ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
    if (::write(std::atoi(arg), &ns, sizeof ns) != sizeof ns) ::_exit(1);
    ::_exit(0);
  }
  if (what == "exit-after" && argc > 3) {
    ::usleep(static_cast<useconds_t>(std::atoi(arg)) * 1000);
    return std::atoi(argv[3]);
  }
  if (what == "record-error") {
    cohort::error_report report{std::string("std::runtime_error: ") + arg, "frame 1\nframe 2", std::nullopt};
    if (argc > 3) report.timestamp = std::chrono::system_clock::time_point(std::chrono::seconds(std::atoll(argv[3])));
    if (!cohort::record_error(report)) return 2;
    if (argc > 4) ::usleep(static_cast<useconds_t>(std::atoi(argv[4])) * 1000);
    return 1;
  }
  if (what == "leave-error-file") {
    // One rank records an error; then a forked child calls exit(), and this
    // process exits with the group never destroyed. Prints the rank's error
    // file and whether it was there after the wait and after the child.
    asio::io_context io;
    cohort::group_spec spec;
    spec.entry = cohort::command(argv[0], {"record-error", "left"});
    spec.nprocs = 1;
    cohort::group g = cohort::start_processes(io.get_executor(), spec);
    std::optional<cohort::run_result> result;
    g.wait([&](std::exception_ptr, cohort::run_result r) { result = std::move(r); });
    io.run();
    if (!result || result->failures.empty()) return 5;
    const std::filesystem::path file = result->failures[0].error_file;
    const bool after_wait = std::filesystem::exists(file);
    const pid_t forked = ::fork();
    if (forked == 0) std::exit(0);
    ::waitpid(forked, nullptr, 0);
    const bool after_child = std::filesystem::exists(file);
    std::printf("%s %d %d\n", file.c_str(), after_wait, after_child);
    std::fflush(stdout);
    std::exit(0);
  }
  if (what == "exit-env") {
    const char* value = std::getenv(arg);
    return value != nullptr ? std::atoi(value) : 100;
  }
  if (what == "wait-on-queue") {
    const auto later = std::chrono::milliseconds(std::atoi(arg));
    cohort::queue<int> q(1);
    std::atomic<bool> timing{false};  // the second put's pause starts once the timed wait's clocks are read
    std::jthread putter([q, later, &timing]() mutable {
      std::this_thread::sleep_for(later);
      q.put(7);
      timing.wait(false);
      std::this_thread::sleep_for(later);
      q.put(8);
    });
    try {
      std::printf("%d\n", q.get().value());
    } catch (const std::exception& e) {
      std::printf("%s\n", e.what());
    }
    asio::io_context io;
    cohort::use_reactor_only(io);
    const long long cpu = milliseconds_of(CLOCK_PROCESS_CPUTIME_ID), wall = milliseconds_of(CLOCK_MONOTONIC);
    timing = true;
    timing.notify_one();
    asio::co_spawn(
        io,
        [q]() mutable -> asio::awaitable<void> {
          try {
            const int value = co_await q.pop();
            std::printf("%d\n", value);
          } catch (const std::exception& e) {
            std::printf("%s\n", e.what());
          }
        },
        asio::detached);
    io.run();
    std::printf("%lld %lld\n", milliseconds_of(CLOCK_PROCESS_CPUTIME_ID) - cpu,
                milliseconds_of(CLOCK_MONOTONIC) - wall);
    return 0;
  }
  if (what == "setsid-grandchild") {
    int ready[2];
    if (::pipe(ready) != 0) return 101;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setsid();
      ::close(ready[0]);
      ::close(ready[1]);  // tells the parent setsid() is done
      ::sleep(60);
      ::_exit(0);
    }
    ::close(ready[1]);
    char byte;
    [[maybe_unused]] auto n = ::read(ready[0], &byte, 1);
    std::printf("%d\n", pid);
    std::fflush(stdout);
    return std::atoi(arg);
  }
  return usage();
}
