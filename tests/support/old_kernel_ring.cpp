// Loaded with LD_PRELOAD: io_uring as kernels before 5.19 answer what an
// io_context's end asks of it. They refuse a cancel that carries flags
// (IORING_ASYNC_CANCEL_ANY and the others) with EINVAL, cancelling nothing:
// each such cancel is turned, on its way to the kernel, into one that
// matches no request. And before 5.1x, a submission made while completions
// wait in the kernel's backlog (more than the completion queue holds) is
// refused with EBUSY once the backlog, flushed as far as it fits, is not
// empty. Nothing else changes.
#include <liburing.h>

#include <dlfcn.h>

#include <cerrno>

namespace {

using submit_fn = int (*)(io_uring*);

void strip_cancel_flags(io_uring& ring) {
  // The entries queued since the last submission.
  for (unsigned i = ring.sq.sqe_head; i != ring.sq.sqe_tail; ++i) {
    io_uring_sqe& sqe = ring.sq.sqes[i & ring.sq.ring_mask];
    if (sqe.opcode == IORING_OP_ASYNC_CANCEL && sqe.cancel_flags != 0) {
      sqe.cancel_flags = 0;
      sqe.addr = 0;  // the user data of no request
    }
  }
}

}  // namespace

extern "C" int io_uring_submit(io_uring* ring) {
  static const auto next = reinterpret_cast<submit_fn>(::dlsym(RTLD_NEXT, "io_uring_submit"));
  if (io_uring_cq_has_overflow(ring)) {
    io_uring_get_events(ring);
    if (io_uring_cq_has_overflow(ring)) return -EBUSY;
  }
  strip_cancel_flags(*ring);
  return next(ring);
}
