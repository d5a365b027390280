// Capturing and symbolizing the stack. The unwinder (backtrace(3)) gives
// the frames' addresses; elfutils' libdw names them, reading only the
// modules on the stack, each the first time one of its frames is named.
// libdw is loaded when a stack is first symbolized: a process that never
// fails never loads it. Without it, dladdr names what the dynamic symbol
// tables export.
#include "os/stack_trace.hpp"

#include "os/demangle.hpp"
#include "os/fork_safe_mutex.hpp"
#include "os/stack_switch.hpp"

#include <fmt/format.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>

#if __has_include(<elfutils/libdwfl.h>) && defined(COHORT_HAVE_LIBDW)
#include <dwarf.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <libelf.h>
#define COHORT_USE_LIBDW 1
#endif

namespace cohort::os {
namespace {

constexpr std::size_t max_frames = 128;

// The path of the module dladdr found: for the program, its own path where
// it was started as /proc/self/exe (a spawned rank), which names another
// program to whoever reads the trace.
std::string module_path(const Dl_info& info) {
  std::string module = info.dli_fname;
  if (module == "/proc/self/exe") {
    std::array<char, 4096> path{};
    const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
    if (n > 0) module.assign(path.data(), static_cast<std::size_t>(n));
  }
  return module;
}

// The module holding `pc` and pc's offset in it.
std::pair<std::string, std::uintptr_t> module_of(std::uintptr_t pc) {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fname == nullptr) return {"", pc};
  return {module_path(info), pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase)};
}

// The calling function's callers' addresses, innermost first, at most
// max_frames; `cut` says whether the stack held more. A return address
// points after its call: each steps back into the call, so the frame names
// the calling function and the call's line.
[[gnu::noinline]] std::vector<std::uintptr_t> caller_pcs(bool& cut) {
  // pcs[0] is in caller_pcs, pcs[1] in current_stack; one more than is
  // kept tells a stack cut off from one that fills the rest exactly.
  std::array<void*, max_frames + 3> pcs{};
  const int n = ::backtrace(pcs.data(), static_cast<int>(pcs.size()));
  cut = n == static_cast<int>(pcs.size());
  std::vector<std::uintptr_t> out;
  for (int i = 2; i < n && out.size() < max_frames; ++i) out.push_back(reinterpret_cast<std::uintptr_t>(pcs[i]) - 1);
  return out;
}

// The frame at `pc` as one dladdr names it: its module, and the exported
// symbol that covers it, demangled (empty where none does).
stack_frame named_by_dladdr(std::uintptr_t pc) {
  stack_frame f;
  f.pc = pc;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(pc), &info) == 0) return f;
  if (info.dli_sname != nullptr) f.function = demangle(info.dli_sname);
  if (info.dli_fname != nullptr) f.module = module_path(info);
  return f;
}

#ifdef COHORT_USE_LIBDW

// libdw's functions, found in the shared library loaded at first use.
struct libdw {
  decltype(&::dwfl_begin) begin;
  decltype(&::dwfl_end) end;
  decltype(&::dwfl_report_begin) report_begin;
  decltype(&::dwfl_linux_proc_report) proc_report;
  decltype(&::dwfl_report_end) report_end;
  decltype(&::dwfl_addrmodule) addrmodule;
  decltype(&::dwfl_module_addrname) addrname;
  decltype(&::dwfl_module_addrdie) addrdie;
  decltype(&::dwfl_module_nextcu) nextcu;
  decltype(&::dwarf_haspc) haspc;
  decltype(&::dwarf_getsrc_die) getsrc_die;
  decltype(&::dwarf_linesrc) linesrc;
  decltype(&::dwarf_lineno) lineno;
  decltype(&::dwarf_getscopes) getscopes;
  decltype(&::dwarf_getscopes_die) getscopes_die;
  decltype(&::dwarf_tag) tag;
  decltype(&::dwarf_attr_integrate) attr_integrate;
  decltype(&::dwarf_formstring) formstring;
  decltype(&::dwarf_formudata) formudata;
  decltype(&::dwarf_diename) diename;
  decltype(&::dwarf_getsrcfiles) getsrcfiles;
  decltype(&::dwarf_filesrc) filesrc;
  decltype(&::dwfl_module_build_id) module_build_id;
  decltype(&::dwelf_elf_gnu_build_id) elf_build_id;
  decltype(&::elf_begin) elf_begin;  // libelf's, found through libdw
  decltype(&::elf_end) elf_end;
  /// zlib's crc32, loaded with libdw (which reads compressed sections with
  /// it); null where it is not.
  unsigned long (*crc32)(unsigned long, const unsigned char*, unsigned) = nullptr;
  Dwfl_Callbacks callbacks{};
};

int find_debug_file(Dwfl_Module* module, void** userdata, const char* name, GElf_Addr base, const char* file_name,
                    const char* debuglink, GElf_Word crc, char** found);

template <class F>
bool find(void* library, const char* name, F& fn) {
  fn = reinterpret_cast<F>(::dlsym(library, name));
  return fn != nullptr;
}

libdw* load_libdw() {
  // Kept loaded for the life of the process, as its functions are.
  void* library = ::dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return nullptr;
  static libdw dw;
  const bool all = find(library, "dwfl_begin", dw.begin) && find(library, "dwfl_end", dw.end) &&
                   find(library, "dwfl_report_begin", dw.report_begin) &&
                   find(library, "dwfl_linux_proc_report", dw.proc_report) &&
                   find(library, "dwfl_report_end", dw.report_end) && find(library, "dwfl_addrmodule", dw.addrmodule) &&
                   find(library, "dwfl_module_addrname", dw.addrname) &&
                   find(library, "dwfl_module_addrdie", dw.addrdie) && find(library, "dwfl_module_nextcu", dw.nextcu) &&
                   find(library, "dwarf_haspc", dw.haspc) && find(library, "dwarf_getsrc_die", dw.getsrc_die) &&
                   find(library, "dwarf_linesrc", dw.linesrc) && find(library, "dwarf_lineno", dw.lineno) &&
                   find(library, "dwarf_getscopes", dw.getscopes) &&
                   find(library, "dwarf_getscopes_die", dw.getscopes_die) &&
                   find(library, "dwarf_tag", dw.tag) && find(library, "dwarf_attr_integrate", dw.attr_integrate) &&
                   find(library, "dwarf_formstring", dw.formstring) && find(library, "dwarf_formudata", dw.formudata) &&
                   find(library, "dwarf_diename", dw.diename) && find(library, "dwarf_getsrcfiles", dw.getsrcfiles) &&
                   find(library, "dwarf_filesrc", dw.filesrc) &&
                   find(library, "dwfl_module_build_id", dw.module_build_id) &&
                   find(library, "dwelf_elf_gnu_build_id", dw.elf_build_id) &&
                   find(library, "elf_begin", dw.elf_begin) && find(library, "elf_end", dw.elf_end) &&
                   find(library, "dwfl_linux_proc_find_elf", dw.callbacks.find_elf);
  if (!all) return nullptr;
  find(library, "crc32", dw.crc32);
  dw.callbacks.find_debuginfo = find_debug_file;
  return &dw;
}

const libdw* the_libdw() {
  static libdw* dw = load_libdw();
  return dw;
}

// Whether the ELF file open at `fd` carries the build id `id`.
bool carries(const libdw& dw, int fd, std::string_view id) {
  Elf* elf = dw.elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) return false;
  const void* bits = nullptr;
  const ssize_t n = dw.elf_build_id(elf, &bits);
  const bool same = n > 0 && std::string_view(static_cast<const char*>(bits), static_cast<std::size_t>(n)) == id;
  dw.elf_end(elf);
  return same;
}

// Whether the file open at `fd` has the CRC-32 `crc` (a .gnu_debuglink's),
// read from its start.
bool has_crc(const libdw& dw, int fd, GElf_Word crc) {
  if (dw.crc32 == nullptr) return false;
  std::array<unsigned char, 1 << 16> buffer{};
  unsigned long sum = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;
    sum = dw.crc32(sum, buffer.data(), static_cast<unsigned>(n));
  }
  return sum == crc;
}

// libdw's find_debuginfo: a module's separate debug file where toolchains
// and distributions put it, by build id under /usr/lib/debug/.build-id, else
// by its .gnu_debuglink name beside the module, in .debug/ there, and under
// /usr/lib/debug; taken only if it carries the module's build id (for a
// module without one, if it has the CRC its debuglink names). Never
// through debuginfod, as libdw's standard search would: a failing process
// does not wait on the network, nor load its client (30 libraries).
int find_debug_file(Dwfl_Module* module, void**, const char*, GElf_Addr, const char* file_name,
                    const char* debuglink, GElf_Word debuglink_crc, char** found) {
  const libdw& dw = *the_libdw();
  const unsigned char* bits = nullptr;
  GElf_Addr at = 0;
  const int n = dw.module_build_id(module, &bits, &at);
  const std::string_view id(reinterpret_cast<const char*>(bits), n > 0 ? static_cast<std::size_t>(n) : 0);
  std::vector<std::string> candidates;
  if (!id.empty()) {
    std::string hex;
    for (const unsigned char c : id) hex += fmt::format("{:02x}", c);
    candidates.push_back(fmt::format("/usr/lib/debug/.build-id/{}/{}.debug", hex.substr(0, 2), hex.substr(2)));
  }
  if (debuglink != nullptr && file_name != nullptr) {
    const std::string_view file = file_name;
    const auto slash = file.rfind('/');
    const std::string dir = slash == std::string_view::npos ? "." : std::string(file.substr(0, slash));
    candidates.push_back(fmt::format("{}/{}", dir, debuglink));
    candidates.push_back(fmt::format("{}/.debug/{}", dir, debuglink));
    candidates.push_back(fmt::format("/usr/lib/debug{}{}/{}", dir.starts_with('/') ? "" : "/", dir, debuglink));
  }
  for (const auto& candidate : candidates) {
    if (file_name != nullptr && candidate == file_name) continue;  // the module itself
    const int fd = ::open(candidate.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (id.empty() ? has_crc(dw, fd, debuglink_crc) : carries(dw, fd, id)) {
      *found = ::strdup(candidate.c_str());
      return fd;
    }
    ::close(fd);
  }
  return -1;
}

// The C and C++ runtimes' own libraries. Their frames are the throw's
// machinery and the start of the program, named from their symbol tables;
// their debug information, where installed, comes compressed in files of
// its own (libc6-dbg's), which take tens of milliseconds to read.
bool of_the_runtime(std::string_view module) {
  const auto slash = module.rfind('/');
  const auto name = slash == std::string_view::npos ? module : module.substr(slash + 1);
  for (std::string_view soname : {"libc.so", "libm.so", "libstdc++.so", "libgcc_s.so", "ld-linux"}) {
    if (name.starts_with(soname)) return true;
  }
  return false;
}

// A symbol's name without its version ("__libc_start_main@@GLIBC_2.34").
std::string symbol_name(const char* symbol) {
  if (symbol == nullptr) return "";
  const std::string_view s = symbol;
  return demangle(std::string(s.substr(0, s.find('@'))).c_str());
}

// A function's name in DWARF: its linkage name demangled (qualified, with
// its parameters), else its plain name.
std::string function_name(const libdw& dw, Dwarf_Die* die) {
  Dwarf_Attribute attr;
  for (int at : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
    if (dw.attr_integrate(die, at, &attr) != nullptr) {
      if (const char* s = dw.formstring(&attr)) return demangle(s);
    }
  }
  const char* name = dw.diename(die);
  return name != nullptr ? name : "";
}

// `file` as named in a compilation unit's line table: a relative name is
// relative to the unit's compilation directory.
std::string source_file(const libdw& dw, Dwarf_Die* cu, const char* file) {
  if (file[0] == '/') return file;
  Dwarf_Attribute attr;
  const char* dir = dw.attr_integrate(cu, DW_AT_comp_dir, &attr) != nullptr ? dw.formstring(&attr) : nullptr;
  return dir != nullptr ? fmt::format("{}/{}", dir, file) : file;
}

// The compilation unit whose code holds `pc`, and the module's bias: found
// through .debug_aranges, else by each unit's own ranges. clang writes no
// aranges by default; in a module that mixes its units with gcc's, libdw
// answers from gcc's aranges with a unit that does not hold pc.
Dwarf_Die* unit_at(const libdw& dw, Dwfl_Module* module, std::uintptr_t pc, Dwarf_Addr& bias) {
  if (Dwarf_Die* cu = dw.addrdie(module, pc, &bias); cu != nullptr && dw.haspc(cu, pc - bias) > 0) return cu;
  for (Dwarf_Die* cu = dw.nextcu(module, nullptr, &bias); cu != nullptr; cu = dw.nextcu(module, cu, &bias)) {
    if (dw.haspc(cu, pc - bias) > 0) return cu;
  }
  return nullptr;
}

// The frames at `pc` of a module with DWARF: the inlined calls there,
// innermost first, then the function that holds them. False without DWARF
// covering pc.
bool add_inlined_frames(const libdw& dw, Dwfl_Module* module, std::uintptr_t pc, const stack_frame& physical,
                        std::vector<stack_frame>& frames) {
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = unit_at(dw, module, pc, bias);
  if (cu == nullptr) return false;
  // Where pc is: the innermost function's file and line.
  stack_frame at = physical;
  if (Dwarf_Line* line = dw.getsrc_die(cu, pc - bias)) {
    int number = 0;
    const char* file = dw.linesrc(line, nullptr, nullptr);
    if (file != nullptr && dw.lineno(line, &number) == 0) {
      at.file = source_file(dw, cu, file);
      at.line = number;
    }
  }
  // The scopes around pc, innermost first. Past an inlined call they are
  // its parents where it was written; those of the code it was inlined
  // into come from the innermost scope, outward (a second walk of the
  // unit's entries, made only then): each inlined call, then the function.
  Dwarf_Die* scopes = nullptr;
  int n = dw.getscopes(cu, pc - bias, &scopes);
  const bool inlined = std::any_of(scopes, scopes + std::max(n, 0),
                                   [&](Dwarf_Die& scope) { return dw.tag(&scope) == DW_TAG_inlined_subroutine; });
  if (inlined) {
    Dwarf_Die innermost = scopes[0];
    std::free(scopes);
    scopes = nullptr;
    n = dw.getscopes_die(&innermost, &scopes);
  }
  Dwarf_Files* files = nullptr;
  std::size_t file_count = 0;
  bool have_files = false;
  for (int i = 0; i < n; ++i) {
    Dwarf_Die* scope = &scopes[i];
    const int tag = dw.tag(scope);
    if (tag != DW_TAG_inlined_subroutine && tag != DW_TAG_subprogram) continue;
    stack_frame f = at;
    if (tag == DW_TAG_subprogram) {
      if (f.function.empty()) f.function = function_name(dw, scope);
      frames.push_back(std::move(f));
      std::free(scopes);
      return true;
    }
    f.function = function_name(dw, scope);
    frames.push_back(std::move(f));
    // The caller's place: where this call was inlined.
    at.file.clear();
    at.line = 0;
    Dwarf_Attribute attr;
    Dwarf_Word value = 0;
    if (!have_files) have_files = dw.getsrcfiles(cu, &files, &file_count) == 0;
    if (have_files && dw.attr_integrate(scope, DW_AT_call_file, &attr) != nullptr && dw.formudata(&attr, &value) == 0 &&
        value < file_count) {
      if (const char* file = dw.filesrc(files, value, nullptr, nullptr)) at.file = source_file(dw, cu, file);
    }
    if (dw.attr_integrate(scope, DW_AT_call_line, &attr) != nullptr && dw.formudata(&attr, &value) == 0) {
      at.line = static_cast<int>(value);
    }
  }
  std::free(scopes);
  // No function around pc: the frame as its line table places it.
  frames.push_back(std::move(at));
  return true;
}

// How long a thread waits for another's naming of its frames before it
// names its own through dladdr.
constexpr auto symbolizer_wait = std::chrono::seconds(5);

// The frames at `pcs`, named by libdw; false where it cannot start, or
// another thread names its own for longer than symbolizer_wait.
bool symbolize(const std::vector<std::uintptr_t>& pcs, std::vector<stack_frame>& frames) {
  // libdw is not built thread-safe: one thread symbolizes at a time. The
  // wait for it is bounded: the thread that has it may be waiting for the
  // dynamic loader's lock (loading libdw, or in dladdr), which this thread
  // may hold (an exception thrown by a constructor that dlopen runs).
  static fork_safe_mutex one_at_a_time;
  std::unique_lock lock(one_at_a_time, std::try_to_lock);
  for (const auto until = std::chrono::steady_clock::now() + symbolizer_wait; !lock.owns_lock();) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lock.try_lock();
  }
  const libdw* dw = the_libdw();
  if (dw == nullptr) return false;
  Dwfl* session = dw->begin(&dw->callbacks);
  if (session == nullptr) return false;
  dw->report_begin(session);
  const bool reported = dw->proc_report(session, ::getpid()) == 0 && dw->report_end(session, nullptr, nullptr) == 0;
  if (!reported) {
    dw->end(session);
    return false;
  }
  for (const auto pc : pcs) {
    Dwfl_Module* module = dw->addrmodule(session, pc);
    if (module == nullptr) {
      frames.push_back(named_by_dladdr(pc));
      continue;
    }
    // Named from the full symbol table, else from the exported one.
    stack_frame physical = named_by_dladdr(pc);
    if (std::string name = symbol_name(dw->addrname(module, pc)); !name.empty()) physical.function = std::move(name);
    if (of_the_runtime(physical.module) || !add_inlined_frames(*dw, module, pc, physical, frames)) {
      frames.push_back(std::move(physical));
    }
    if (frames.size() >= max_frames) break;
  }
  dw->end(session);
  return true;
}

// libdw reads a line table with about 150 KiB of stack (elfutils 0.188),
// more than a thread of a pool or a fiber may have left: the frames are
// named on a stack of their own, with room to spare, on the calling thread
// (another thread would wait forever for the dynamic loader's lock where
// this one holds it: an exception thrown by a library's constructor as
// dlopen runs it).
constexpr std::size_t symbolizer_stack = 2 << 20;

struct symbolizing {
  const std::vector<std::uintptr_t>* pcs;
  std::vector<stack_frame>* frames;
  bool named = false;
};

// Nothing escapes it: the unwinder finds no frame below it.
void symbolize_there(void* job) {
  auto& j = *static_cast<symbolizing*>(job);
  try {
    j.named = symbolize(*j.pcs, *j.frames);
  } catch (...) {
    j.named = false;  // out of memory: dladdr names them
  }
}

// The frames at `pcs`, named by libdw on a stack of symbolizer_stack bytes
// (and a guard page below it); false where libdw or that stack cannot be
// had.
bool symbolize_on_own_stack(const std::vector<std::uintptr_t>& pcs, std::vector<stack_frame>& frames) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t mapped = symbolizer_stack + page;
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return false;
  symbolizing job{&pcs, &frames};
  if (::mprotect(base, page, PROT_NONE) == 0) {
    try {
      run_on_stack(static_cast<char*>(base) + page, symbolizer_stack, symbolize_there, &job);
    } catch (const std::system_error&) {
      job.named = false;  // no context to switch to (not x86-64)
    }
  }
  ::munmap(base, mapped);
  return job.named;
}

#endif

}  // namespace

std::vector<stack_frame> current_stack() {
  bool cut = false;
  const auto pcs = caller_pcs(cut);
  std::vector<stack_frame> frames;
#ifdef COHORT_USE_LIBDW
  if (!symbolize_on_own_stack(pcs, frames)) frames.clear();
#endif
  if (frames.empty()) {
    for (const auto pc : pcs) frames.push_back(named_by_dladdr(pc));
  }
  if (!cut && !pcs.empty() && frames.back().pc == pcs.back()) frames.back().outermost = true;
  return frames;
}

std::string describe(const stack_frame& frame) {
  if (!frame.function.empty() && !frame.file.empty()) return fmt::format("{} at {}:{}", frame.function, frame.file, frame.line);
  if (!frame.function.empty()) return fmt::format("{} in {}", frame.function, frame.module.empty() ? "?" : frame.module);
  const auto [module, offset] = module_of(frame.pc);
  return module.empty() ? fmt::format("{:#x}", frame.pc) : fmt::format("{}+{:#x}", module, offset);
}

bool stack_has_source_lines() noexcept {
#ifdef COHORT_USE_LIBDW
  return the_libdw() != nullptr;
#else
  return false;
#endif
}

}  // namespace cohort::os
