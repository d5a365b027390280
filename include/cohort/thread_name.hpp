// The calling thread's name, as tools show it (ps, top, gdb, /proc/<pid>/task/<tid>/comm).
#pragma once

#include "cohort/export.hpp"

#include <string>
#include <string_view>
#include <system_error>

COHORT_API_BEGIN

namespace cohort {

/// Names the calling thread. Linux keeps 15 bytes; a longer name is cut
/// there (as torch.multiprocessing's does). A name holding NUL throws
/// std::invalid_argument.
void set_thread_name(std::string_view name);
void set_thread_name(std::string_view name, std::error_code& ec);

/// The calling thread's name.
std::string thread_name();

}  // namespace cohort

COHORT_API_END
