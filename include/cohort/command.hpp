// What to run: a program and its arguments.
#pragma once

#include "cohort/export.hpp"

#include <string>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

/// A program and its arguments (argv[1...]). `program` is an absolute path,
/// a path relative to the child's working directory when it holds a '/', or a
/// name looked up in PATH (the child's PATH when the spawn options set one,
/// else this process's). argv[0] is `program` as written.
struct command {
  // Constructors rather than an aggregate: g++ 12 miscompiles aggregate
  // temporaries inside a co_await expression, and commands are often built
  // right in `co_await spawn(command(...))`.
  command() = default;
  command(std::string program_, std::vector<std::string> args_ = {})
      : program(std::move(program_)), args(std::move(args_)) {}
  command(const char* program_, std::vector<std::string> args_ = {})
      : program(program_), args(std::move(args_)) {}

  std::string program;
  std::vector<std::string> args;
};

}  // namespace cohort

COHORT_API_END
