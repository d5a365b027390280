// fmt's compiled part, built into the programs that should load nothing but
// libc (meson.build, "lean programs"): Debian ships fmt 9 as a shared
// library only. Its header format-inl.h holds the definitions; outside
// header-only mode they are emitted here as ordinary functions. What the
// library itself would add are the instantiations that fmt/format.h declares
// extern: those for char are made here (a program formatting wchar_t would
// fail to link, not misbehave).
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
template locale_ref::locale_ref(const std::locale&);
template auto locale_ref::get<std::locale>() const -> std::locale;
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl(locale_ref) -> char;
}  // namespace detail
FMT_END_NAMESPACE
