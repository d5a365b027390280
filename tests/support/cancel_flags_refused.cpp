// Loaded with LD_PRELOAD: io_uring as kernels before 5.19 answer a cancel
// that carries flags (IORING_ASYNC_CANCEL_ANY and the others), which they
// refuse with EINVAL, cancelling nothing. Each such cancel is turned, on its
// way to the kernel, into one that matches no request. Nothing else changes.
#include <liburing.h>

#include <dlfcn.h>

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
  strip_cancel_flags(*ring);
  return next(ring);
}
