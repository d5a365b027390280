// Thread names through prctl(PR_SET_NAME / PR_GET_NAME).
#include "cohort/thread_name.hpp"

#include <sys/prctl.h>

#include <cerrno>
#include <stdexcept>
#include <string>

namespace cohort {
namespace {

constexpr std::size_t kernel_limit = 15;  // TASK_COMM_LEN - 1

}  // namespace

void set_thread_name(std::string_view name, std::error_code& ec) {
  ec.clear();
  if (name.find('\0') != std::string_view::npos) throw std::invalid_argument("cohort::set_thread_name: name holds NUL");
  std::string cut(name.substr(0, kernel_limit));
  if (::prctl(PR_SET_NAME, cut.c_str()) != 0) ec.assign(errno, std::system_category());
}

void set_thread_name(std::string_view name) {
  std::error_code ec;
  set_thread_name(name, ec);
  if (ec) throw std::system_error(ec, "cohort::set_thread_name: prctl(PR_SET_NAME)");
}

std::string thread_name() {
  char buf[kernel_limit + 1] = {};
  if (::prctl(PR_GET_NAME, buf) != 0) return {};
  return buf;
}

}  // namespace cohort
