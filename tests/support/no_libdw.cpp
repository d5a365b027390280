// Loaded first (LD_PRELOAD), it makes libdw fail to load, as where libdw1
// is not installed: for the traces named without it.
#include <dlfcn.h>

#include <cstring>

extern "C" __attribute__((visibility("default"))) void* dlopen(const char* file, int mode) {
  if (file != nullptr && std::strstr(file, "libdw") != nullptr) return nullptr;
  static auto* next = reinterpret_cast<void* (*)(const char*, int)>(::dlsym(RTLD_NEXT, "dlopen"));
  return next(file, mode);
}
