// Boost.Process v2, the library baseline of spawn_reap: N children started
// with process(ctx, exe, args), then each waited for.
// std::filesystem instead of Boost.Filesystem, whose compiled library
// Debian's libboost1.81-dev does not bring; Boost 1.81 then forgets to
// include boost::optional itself.
#define BOOST_PROCESS_USE_STD_FS
#include <boost/io/quoted.hpp>
#include <boost/optional.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/process/v2/process.hpp>

#include "boost_baseline.hpp"

#include <vector>

namespace cohort::bench {

void boost_spawn_reap(const char* program, int n) {
  boost::asio::io_context ctx;
  std::vector<boost::process::v2::process> children;
  children.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) children.emplace_back(ctx, program, std::vector<std::string>{});
  for (auto& c : children) c.wait();
}

}  // namespace cohort::bench
