// The rank program of group_teardown: "fail" exits 1 at once, "sleep"
// sleeps until killed.
#include <unistd.h>

#include <cstring>

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "fail") == 0) return 1;
  for (;;) ::pause();
}
