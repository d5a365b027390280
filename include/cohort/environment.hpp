// The environment a child starts with.
#pragma once

#include "cohort/export.hpp"

#include <map>
#include <optional>
#include <string>
#include <vector>

COHORT_API_BEGIN

namespace cohort {

/// A base (this process's environment at spawn time, or nothing) plus
/// variables set or unset on top of it. Later calls win over earlier ones.
class environment {
 public:
  /// This process's environment as it is when the child is spawned.
  static environment inherit() { return environment(true); }
  /// No variables but those set here.
  static environment empty() { return environment(false); }
  /// Exactly these variables.
  static environment from(const std::map<std::string, std::string>& variables);

  environment() = default;  ///< inherit()

  environment& set(std::string name, std::string value);
  environment& unset(std::string name);

  /// The "NAME=value" strings the child gets, sorted by name.
  /// Throws std::invalid_argument for a name that is empty or holds '=' or
  /// NUL, or a value that holds NUL; the message names the variable and
  /// why, a NUL in the name written as `\0`.
  std::vector<std::string> materialize() const;
  /// The same block packed as execve and environ take it: each "NAME=value"
  /// with its NUL, one after another, in `text`, and in `pointers` a
  /// pointer to each, then a null pointer. Two allocations in all, where
  /// the strings are one per variable (a group builds a block per rank).
  /// Throws as materialize() does, leaving both empty.
  void materialize(std::vector<char>& text, std::vector<char*>& pointers) const;
  /// inherit() with no changes: the child gets this process's block as is.
  bool unchanged_inherit() const noexcept { return inherit_ && changes_.empty(); }
  /// The value the child will see for `name`, if any.
  std::optional<std::string> get(const std::string& name) const;
  /// Where a spawn looks for `program`: each directory of the child's PATH
  /// (cohort's default /usr/local/bin:/usr/bin:/bin when unset; an empty
  /// entry is the current directory) joined with `program`, in PATH's
  /// order, whether or not a file is there. Empty for a name holding '/',
  /// which is not searched for, and for an empty name.
  std::vector<std::string> path_candidates(const std::string& program) const;

 private:
  explicit environment(bool inherit) : inherit_(inherit) {}
  // Calls entry(first, value) for each variable of the block, in order:
  // an inherited one whole in `first` with `value` null, a set one as its
  // name and value. Defined where both materialize() use it.
  template <class Entry>
  void merge(Entry&& entry) const;

  bool inherit_ = true;
  std::map<std::string, std::optional<std::string>> changes_;  // nullopt = unset
};

/// Whether `path` names, after symbolic links, a regular file that this
/// process may execute: the candidate a PATH search takes (execve refuses
/// directories and other files that are not regular). Says nothing of the
/// file's format.
bool is_executable_file(const std::string& path) noexcept;

}  // namespace cohort

COHORT_API_END
