// The public view of the ring's probe.
#include "cohort/io_uring_info.hpp"

#include "uring/service.hpp"

namespace cohort {

io_uring_info io_uring_support(asio::io_context& io) {
  const auto& caps = uring::service_for(io.get_executor(), "cohort::io_uring_support").caps();
  return {caps.ring, caps.waitid, caps.poll, caps.read, caps.futex, caps.cancel, caps.why_not};
}

void use_reactor_only(asio::io_context& io) { uring::use_reactor_only(io); }

}  // namespace cohort
