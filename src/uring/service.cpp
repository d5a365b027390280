// The ring, its probe, and the bridge from its completions to asio.
#include "uring/service.hpp"

#include "config.hpp"
#include "os/descriptor_limit.hpp"
#include "os/process_identity.hpp"

#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/strand.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <typeinfo>
#include <utility>
#include <vector>

namespace cohort::uring {
namespace {

constexpr unsigned sq_entries = 256;
// Beyond it, completions wait in the kernel's backlog (see on_ready). A
// ring of 4096 took twice as long to make and remove as one of 1024 (about
// 36 against 18 us), which every blocking spawn_and_join pays.
constexpr unsigned cq_entries = 1024;
// How long shutdown waits for the kernel to confirm cancellations.
constexpr auto shutdown_wait = std::chrono::seconds(5);

bool switched_off() {
  const char* value = std::getenv(config::io_uring_env);
  return value != nullptr && std::string_view(value) == "0";
}

// any_io_executor::target<T>() in Asio 1.22 does not check the type; this does.
template <class T>
const T* exact_target(const asio::any_io_executor& executor) {
  return executor.target_type() == typeid(T) ? executor.target<T>() : nullptr;
}

// Runs `bring_up`, which makes an io_context's service and with it asio's
// reactor: a failure there says only "epoll: Too many open files", so it is
// thrown again naming `what` and the open file limit.
template <class BringUp>
decltype(auto) bringing_up_reactor(const char* what, BringUp bring_up) {
  try {
    return bring_up();
  } catch (const std::system_error& e) {
    throw std::system_error(e.code(), std::string(what) + ": bringing up asio's reactor for the io_context" +
                                          os::descriptor_limit_note(e.code().value()));
  }
}

// Completes an operation that never reached the kernel, through the
// io_context; destroys it uncalled if the context goes first.
struct fail_later {
  operation* op;
  int res;
  fail_later(operation* o, int r) : op(o), res(r) {}
  fail_later(fail_later&& other) noexcept : op(std::exchange(other.op, nullptr)), res(other.res) {}
  fail_later& operator=(fail_later&&) = delete;
  ~fail_later() {
    if (op != nullptr) op->destroy();
  }
  void operator()() { std::exchange(op, nullptr)->complete(res); }
};

}  // namespace

// An io_context's executor, or a strand of one, or a strand of that, with
// any outstanding-work property (the one any_io_executor can take away).
asio::io_context* find_io_context(const asio::any_io_executor& executor) {
  if (!executor) return nullptr;
  auto plain = asio::prefer(executor, asio::execution::outstanding_work.untracked);
  if (auto* ex = exact_target<asio::io_context::executor_type>(plain)) return &ex->context();
  if (auto* strand = exact_target<asio::strand<asio::io_context::executor_type>>(plain)) {
    return &strand->get_inner_executor().context();
  }
  if (auto* strand = exact_target<asio::strand<asio::strand<asio::io_context::executor_type>>>(plain)) {
    return find_io_context(strand->get_inner_executor());
  }
  if (auto* strand = exact_target<asio::strand<asio::any_io_executor>>(plain)) {
    return find_io_context(strand->get_inner_executor());
  }
  return nullptr;
}

asio::io_context& io_context_of(const asio::any_io_executor& executor, const char* what) {
  if (auto* io = find_io_context(executor)) return *io;
  throw std::invalid_argument(
      fmt::format("{}: cohort needs the executor of an asio::io_context (or a strand of one), and this one is {}",
                  what, executor ? "of another kind, or has properties required of it that cohort cannot see through"
                                 : "empty"));
}

service& service_for(const asio::any_io_executor& executor, const char* what) {
  asio::io_context& io = io_context_of(executor, what);
  return bringing_up_reactor(what, [&]() -> service& { return asio::use_service<service>(io); });
}

service::service(asio::io_context& io, bool with_ring) : asio::execution_context::service(io), io_(io) {
  // The descriptor object exists in both modes: it brings up asio's reactor
  // now, while descriptors are surely available, rather than inside some
  // later operation, where a failure could not reach its caller.
  watch_.emplace(io_);
  if (switched_off()) {
    caps_.why_not = std::string(config::io_uring_env) + "=0";
    return;
  }
  if (!with_ring) {
    caps_.why_not = "this io_context runs on asio's reactor only";
    return;
  }
  // IORING_SETUP_SUBMIT_ALL needs Linux 5.18; without it a refused entry
  // stops the rest of a batch, which cohort's one-entry submits never have.
  io_uring_params params{};
  params.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL;
  params.cq_entries = cq_entries;
  int rc = io_uring_queue_init_params(sq_entries, &ring_, &params);
  if (rc == -EINVAL) {
    params = {};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = cq_entries;
    rc = io_uring_queue_init_params(sq_entries, &ring_, &params);
  }
  if (rc < 0) {
    caps_.why_not = std::string("io_uring_queue_init: ") + std::strerror(-rc);
    return;
  }
  // A seccomp filter may allow io_uring_setup and refuse io_uring_enter:
  // asked once now, with nothing to submit, a ring refused from its start
  // is not used. (One refused later, by a filter set once it is made, is
  // retried without end.)
  rc = io_uring_enter(ring_.ring_fd, 0, 0, 0, nullptr);
  if (rc < 0) {
    caps_.why_not = std::string("io_uring_enter: ") + std::strerror(-rc);
    io_uring_queue_exit(&ring_);
    return;
  }
  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  if (probe != nullptr) {
    auto supported = [&](int op) { return io_uring_opcode_supported(probe, op) != 0; };
    caps_.waitid = supported(config::op_waitid);
    caps_.poll = supported(IORING_OP_POLL_ADD);
    caps_.read = supported(IORING_OP_READ);
    caps_.futex = supported(config::op_futex_wait) && supported(config::op_futex_wake);
    caps_.cancel = supported(IORING_OP_ASYNC_CANCEL);
    io_uring_free_probe(probe);
  }
  // asio watches a second descriptor of the ring itself, which reads ready
  // while completions wait: no eventfd to signal on each completion, and
  // none to read before reaping them.
  const int watched = ::fcntl(ring_.ring_fd, F_DUPFD_CLOEXEC, 0);
  const int dup_error = errno;  // before anything below can change it
  if (watched < 0 || !caps_.cancel) {
    caps_ = {};
    caps_.why_not = probe == nullptr ? "io_uring probe refused"
                    : watched < 0    ? std::string("io_uring descriptor not duplicated: ") + std::strerror(dup_error)
                                     : "io_uring lacks IORING_OP_ASYNC_CANCEL";
    if (watched >= 0) ::close(watched);
    io_uring_queue_exit(&ring_);
    return;
  }
  watch_->assign(watched);  // owns the duplicate from here on
  caps_.ring = true;
  owner_ = os::this_process();
}

const capabilities& service::caps() const noexcept {
  if (!caps_.ring || os::this_process() == owner_) return caps_;
  static const capabilities forked = [] {
    capabilities c;
    c.why_not = "a forked child of the process that made this io_context's ring, which the two share";
    return c;
  }();
  return forked;
}

void use_reactor_only(asio::io_context& io) {
  auto made = bringing_up_reactor("cohort::use_reactor_only", [&] { return std::make_unique<service>(io, false); });
  asio::add_service(io, made.get());  // throws asio::service_already_exists, `made` still ours
  made.release();
}

service::~service() {
  if (caps_.ring) io_uring_queue_exit(&ring_);
}

void service::link_locked(operation& op) {
  op.in_flight_ = true;
  op.prev_ = nullptr;
  op.next_ = head_;
  if (head_ != nullptr) head_->prev_ = &op;
  head_ = &op;
  ++in_flight_;
}

// Takes every completion the queue holds, unlinking and adding to `into`
// each operation's (a cancel's, which has none, is passed over); how many
// were taken. At the service's end: no handler runs here.
unsigned service::reap_completions_locked(std::vector<operation*>& into) {
  unsigned head;
  unsigned seen = 0;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    ++seen;
    if (auto* op = static_cast<operation*>(io_uring_cqe_get_data(cqe))) {
      unlink_locked(*op);
      into.push_back(op);
    }
  }
  io_uring_cq_advance(&ring_, seen);
  return seen;
}

void service::unlink_locked(operation& op) {
  if (op.prev_ != nullptr) op.prev_->next_ = op.next_;
  else head_ = op.next_;
  if (op.next_ != nullptr) op.next_->prev_ = op.prev_;
  op.prev_ = op.next_ = nullptr;
  op.in_flight_ = false;
  --in_flight_;
}

// Hands queued entries to the kernel. Entries the kernel could not take yet
// (EAGAIN, EBUSY under completion backlog) stay queued; a retry is posted so
// they are not stranded when no completion is coming to wake us.
void service::flush_locked() {
  int rc;
  do rc = io_uring_submit(&ring_);
  while (rc == -EINTR);
  if (rc < 0 && io_uring_sq_ready(&ring_) > 0) {
    asio::post(io_, [this] {
      std::lock_guard lock(mutex_);
      if (!shut_down_) flush_locked();
    });
  }
}

// Keeps one wait on the ring while anything is in flight, and none
// otherwise: an armed wait counts as work and would keep io_context::run()
// from returning.
void service::arm_locked() {
  if (armed_ || in_flight_ == 0) return;
  armed_ = true;
  watch_->async_wait(asio::posix::stream_descriptor::wait_read,
                     [this](const std::error_code& ec) { on_ready(ec); });
}

// A free submission entry, flushing queued ones to the kernel first when
// the queue is full; nullptr when the kernel takes none.
io_uring_sqe* service::sqe_locked() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    flush_locked();
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

void service::start(operation& op) {
  std::unique_lock lock(mutex_);
  if (shut_down_) {
    lock.unlock();
    op.destroy();
    return;
  }
  io_uring_sqe* sqe = sqe_locked();
  if (sqe == nullptr) {
    lock.unlock();
    asio::post(io_, fail_later(&op, -EBUSY));
    return;
  }
  op.prepare(*sqe);
  io_uring_sqe_set_data(sqe, &op);
  op.cancel_requested_ = false;
  link_locked(op);
  arm_locked();
  flush_locked();
}

// Queues an IORING_OP_ASYNC_CANCEL for `op`; false when no entry was free
// (the cancel is then retried after the next completions are drained).
bool service::queue_cancel_locked(operation& op) {
  io_uring_sqe* sqe = sqe_locked();
  if (sqe == nullptr) return false;
  io_uring_prep_cancel(sqe, &op, 0);
  io_uring_sqe_set_data(sqe, nullptr);  // nobody waits for the cancel's own completion
  return true;
}

void service::cancel(operation& op) {
  if (os::this_process() != owner_) return;  // a forked child's copy of the parent's request
  std::lock_guard lock(mutex_);
  if (shut_down_ || !op.in_flight_ || op.cancel_requested_) return;
  op.cancel_requested_ = true;
  if (queue_cancel_locked(op)) {
    flush_locked();
  } else {
    op.cancel_unsent_ = true;
    ++unsent_cancels_;
  }
}

void service::on_ready(const std::error_code& ec) {
  if (ec == asio::error::operation_aborted) return;
  // A forked child's copy of the watch (one not told of the fork, which
  // shares the parent's epoll set): the completions are the parent's, and
  // reaping them here would run the child's copies of its handlers while
  // the parent never heard of them. The child watches no more.
  if (os::this_process() != owner_) return leave_ring_in_child(false);
  // Collect under the lock, complete outside it: a completion may start or
  // cancel other operations, or resume a coroutine that destroys things.
  struct done {
    operation* op;
    int res;
  };
  std::vector<done> batch;
  std::vector<operation*> orphans;
  {
    std::lock_guard lock(mutex_);
    for (;;) {
      io_uring_cqe* cqe;
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        auto* op = static_cast<operation*>(io_uring_cqe_get_data(cqe));
        if (op == nullptr) continue;
        const int res = cqe->res;
        if (!op->cancel_requested_ && (res == -ECANCELED || op->orphaned(res))) {
          orphans.push_back(op);  // its thread exited; it stays in flight
          continue;
        }
        if (op->cancel_unsent_) {
          op->cancel_unsent_ = false;
          --unsent_cancels_;
        }
        unlink_locked(*op);
        batch.push_back({op, res});
      }
      io_uring_cq_advance(&ring_, seen);
      // Completions beyond the queue's size wait in the kernel's backlog
      // until asked for.
      if (!io_uring_cq_has_overflow(&ring_)) break;
      io_uring_get_events(&ring_);
    }
    for (operation* op : orphans) {
      if (io_uring_sqe* sqe = sqe_locked()) {
        op->prepare(*sqe);
        io_uring_sqe_set_data(sqe, op);
      } else {
        unlink_locked(*op);
        batch.push_back({op, -EBUSY});
      }
    }
    if (unsent_cancels_ > 0) {
      for (operation* op = head_; op != nullptr; op = op->next_) {
        if (op->cancel_unsent_ && queue_cancel_locked(*op)) {
          op->cancel_unsent_ = false;
          --unsent_cancels_;
        }
      }
    }
    if (io_uring_sq_ready(&ring_) > 0) flush_locked();
    armed_ = false;
    arm_locked();
  }
  for (auto [op, res] : batch) op->complete(res);
}

// In a forked child: the child's descriptor of the ring goes, and no wait
// is armed on it here any more. Told of the fork, the child has an epoll
// set of its own by now (asio's reactor was told first: it was made before
// this service), and the descriptor leaves it. Otherwise the set is the
// parent's too: the descriptor is closed first, so that asio's removal of
// it fails (EPOLL_CTL_DEL of one open file would end the parent's watch,
// and the parent would never hear of a completion again).
void service::leave_ring_in_child(bool own_epoll) {
  if (!watch_) return;
  const int fd = watch_->native_handle();
  if (!own_epoll) ::close(fd);
  (void)watch_->release();
  if (own_epoll) ::close(fd);
  watch_.reset();
}

// A forked child stops watching the ring as it is told of the fork: the
// parent's completions reach only the parent. Its copies of the parent's
// operations in flight could never complete there, and would keep its
// run() from returning: they complete as cancelled.
void service::notify_fork(asio::execution_context::fork_event event) {
  if (event != asio::execution_context::fork_child || !caps_.ring || os::this_process() == owner_) return;
  leave_ring_in_child(true);
  for (operation* op : take_copies_in_child()) op->complete(-ECANCELED);
}

// In a forked child: the copies of the parent's operations, taken off the
// list. The kernel writes only into the parent's memory, so they are the
// child's to end.
std::vector<operation*> service::take_copies_in_child() {
  std::vector<operation*> copies;
  std::lock_guard lock(mutex_);
  for (operation* op = head_; op != nullptr; op = op->next_) copies.push_back(op);
  for (operation* op : copies) unlink_locked(*op);
  unsent_cancels_ = 0;
  return copies;
}

// Called before any context object is destroyed. The kernel may still write
// into in-flight operations (a waitid's siginfo), so every request is
// cancelled and its completion awaited before the operations are destroyed.
void service::shutdown() {
  if (!caps_.ring) {
    watch_.reset();
    return;
  }
  if (os::this_process() != owner_) {
    // A forked child's copy: the requests in flight are the parent's, and
    // a cancellation here would end them on the ring the two share, this
    // process reaping their completions. Its copies of them are destroyed.
    leave_ring_in_child(false);
    for (operation* op : take_copies_in_child()) op->destroy();
    return;
  }
  std::vector<operation*> confirmed;
  {
    std::lock_guard lock(mutex_);
    shut_down_ = true;
    // One cancel per operation, by its user data: IORING_ASYNC_CANCEL_ANY
    // would do it in one, but kernels before 5.19 refuse any cancel flag
    // (EINVAL), and nothing was cancelled there. The cancels are queued as
    // entries free up, the completions reaped in between: a kernel with a
    // backlog of completions refuses new entries (EBUSY) until they are.
    std::vector<operation*> to_cancel;
    for (operation* op = head_; op != nullptr; op = op->next_) to_cancel.push_back(op);
    std::size_t next = 0;
    const auto deadline = std::chrono::steady_clock::now() + shutdown_wait;
    while (in_flight_ > 0 && std::chrono::steady_clock::now() < deadline) {
      // Each stays allocated until the end below, completed or not.
      for (; next < to_cancel.size(); ++next) {
        if (!to_cancel[next]->in_flight_) continue;  // completed meanwhile
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) break;
        io_uring_prep_cancel(sqe, to_cancel[next], 0);
        io_uring_sqe_set_data(sqe, nullptr);
      }
      if (io_uring_sq_ready(&ring_) > 0) io_uring_submit(&ring_);
      const unsigned seen = reap_completions_locked(confirmed);
      if (io_uring_cq_has_overflow(&ring_)) io_uring_get_events(&ring_);
      if (seen == 0 && in_flight_ > 0) {
        __kernel_timespec tick{.tv_sec = 0, .tv_nsec = 10'000'000};
        io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe_timeout(&ring_, &cqe, &tick) != 0) {
          const timespec pause{0, 1'000'000};  // a wait refused (EBUSY without a timed wait): a short pause
          ::nanosleep(&pause, nullptr);
        }
      }
    }
    // Whatever is still listed never confirmed its cancellation: its memory
    // is leaked rather than freed while the kernel may still write to it.
    head_ = nullptr;
  }
  watch_.reset();
  for (operation* op : confirmed) op->destroy();
}

}  // namespace cohort::uring
