// join_options that name only how the ranks start, as the tests pass them.
#pragma once

#include <cohort/spawn_and_join.hpp>

namespace cohort::test {

/// The default join_options but for `method`. A named object: g++ 12
/// refuses join_options in braces (cohort/compiler.hpp), and tests run
/// most calls once per start method.
inline const join_options& join_by(start_method method) {
  static const join_options spawn{.method = start_method::spawn};
  static const join_options fork{.method = start_method::fork};
  static const join_options forkserver{.method = start_method::forkserver};
  switch (method) {
    case start_method::fork:
      return fork;
    case start_method::forkserver:
      return forkserver;
    case start_method::spawn:
      break;
  }
  return spawn;
}

}  // namespace cohort::test
