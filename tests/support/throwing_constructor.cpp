// A library whose global constructor throws, as dlopen runs it with the
// dynamic loader's lock held: for the trace of an exception that escapes
// there (tests/launch/error_file.cpp, through `thrower constructor`).
#include <stdexcept>

namespace throwing_constructor {

struct settings {
  settings() { throw std::runtime_error("thrown by a constructor as its library loads"); }
};

const settings loaded;

}  // namespace throwing_constructor
