// Everything cohort offers, in one include.
#pragma once

#include "cohort/child.hpp"
#include "cohort/command.hpp"
#include "cohort/encoding.hpp"
#include "cohort/entry_point.hpp"
#include "cohort/environment.hpp"
#include "cohort/error_file.hpp"
#include "cohort/exit_status.hpp"
#include "cohort/group.hpp"
#include "cohort/io_uring_info.hpp"
#include "cohort/process_error.hpp"
#include "cohort/spawn.hpp"
#include "cohort/spawn_and_join.hpp"
#include "cohort/stdio.hpp"
#include "cohort/thread_name.hpp"
#include "cohort/when_any.hpp"
