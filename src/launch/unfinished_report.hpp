// The name of a report while it is being written. An error file is
// written beside its place and renamed over it once whole; a rank killed
// meanwhile leaves that file behind, which whoever prepares the place for
// the next run recognises by this name.
#pragma once

#include <filesystem>
#include <string_view>

namespace cohort::detail {

/// Where this process writes the `n`th report it puts at `report`:
/// "<report>.<pid>-<n>.tmp", beside it.
std::filesystem::path unfinished_report(const std::filesystem::path& report, unsigned n);

/// Whether `name`, a file name, is one that unfinished_report() gives a
/// report named `report_name` (a file name too): "<report_name>.<digits>-<digits>.tmp".
bool is_unfinished_report(std::string_view name, std::string_view report_name) noexcept;

}  // namespace cohort::detail
