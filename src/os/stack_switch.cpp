// The switch onto another stack: a few instructions on x86-64, libc's
// contexts elsewhere.
#include "os/stack_switch.hpp"

#include "config.hpp"

#include <ucontext.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace cohort::os {

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
// Calls `fn(arg)` with the stack pointer at `top`, and returns when it does.
// Its frame records no return address, as glibc's start of a makecontext
// stack does, so the unwinder ends there. Placed with the rest of a forked
// child's path (a function rank runs on a stack of its own): libc's
// getcontext, makecontext and swapcontext would each fault in a page of
// libc's code in every child, and two of them change the signal mask by a
// system call.
extern "C" void cohort_stack_switch(void* top, void (*fn)(void*), void* arg);
asm(R"(
  .pushsection .text.hot.cohort_stack_switch,"ax",@progbits
  .p2align 4
  .type cohort_stack_switch, @function
cohort_stack_switch:
  .cfi_startproc
  .cfi_undefined rip
  pushq %rbp
  movq %rsp, %rbp
  movq %rdi, %rsp
  movq %rdx, %rdi
  callq *%rsi
  movq %rbp, %rsp
  popq %rbp
  ret
  .cfi_endproc
  .size cohort_stack_switch, .-cohort_stack_switch
  .popsection
)");

COHORT_FORKED_CHILD_PATH void run_on_stack(void* bottom, std::size_t size, void (*fn)(void*), void* arg) {
  const auto top = reinterpret_cast<std::uintptr_t>(bottom) + size;
  cohort_stack_switch(reinterpret_cast<void*>(top & ~std::uintptr_t{15}), fn, arg);
}
#else
namespace {

struct call {
  void (*fn)(void*);
  void* arg;
};

// makecontext passes ints only: the call's address in two halves.
void start_context(unsigned high, unsigned low) {
  const auto* c = reinterpret_cast<const call*>((std::uintptr_t{high} << 32) | low);
  c->fn(c->arg);
}

}  // namespace

void run_on_stack(void* bottom, std::size_t size, void (*fn)(void*), void* arg) {
  const call c{fn, arg};
  const auto address = reinterpret_cast<std::uintptr_t>(&c);
  ucontext_t caller{}, callee{};
  if (::getcontext(&callee) != 0) throw std::system_error(errno, std::system_category(), "cohort: getcontext");
  callee.uc_stack.ss_sp = bottom;
  callee.uc_stack.ss_size = size;
  callee.uc_link = &caller;  // where fn's return goes
  ::makecontext(&callee, reinterpret_cast<void (*)()>(start_context), 2, static_cast<unsigned>(address >> 32),
                static_cast<unsigned>(address));
  if (::swapcontext(&caller, &callee) != 0) {
    throw std::system_error(errno, std::system_category(), "cohort: swapcontext");
  }
}
#endif

}  // namespace cohort::os
