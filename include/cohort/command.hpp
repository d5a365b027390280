// What to run: a program and its arguments.
#pragma once

#include "cohort/export.hpp"

#include <concepts>
#include <string>
#include <utility>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

/// A program and its arguments (argv[1...]). `program` is an absolute path,
/// a path relative to the child's working directory when it holds a '/', or a
/// name looked up in PATH (the child's PATH when the spawn options set one,
/// else this process's). argv[0] is `program` as written.
struct command {
  /// The arguments a command is built with: a vector, or strings listed in
  /// braces, `command("ls", {"-l", dir})`. The braces call a constructor
  /// rather than make a std::initializer_list, which g++ 12 cannot compile
  /// inside a co_await expression (cohort/compiler.hpp), so a command may be
  /// built right in `co_await spawn(command(...))`.
  class arguments {
   public:
    arguments() = default;
    arguments(std::vector<std::string> list) : list_(std::move(list)) {}
    template <class... S>
      requires(sizeof...(S) > 0 && (std::constructible_from<std::string, S> && ...))
    arguments(S&&... each) {
      list_.reserve(sizeof...(S));
      (list_.emplace_back(std::forward<S>(each)), ...);
    }
    /// Hands over the list; the arguments are left empty.
    std::vector<std::string> take() && { return std::move(list_); }

   private:
    std::vector<std::string> list_;
  };

  // Constructors rather than an aggregate: g++ 12 destroys an aggregate
  // temporary inside a co_await expression twice.
  command() = default;
  command(std::string program_, arguments args_ = {})
      : program(std::move(program_)), args(std::move(args_).take()) {}
  command(const char* program_, arguments args_ = {})
      : program(program_), args(std::move(args_).take()) {}

  std::string program;
  std::vector<std::string> args;
};

}  // namespace cohort

COHORT_API_END
