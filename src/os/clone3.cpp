#include "os/clone3.hpp"

#include <cerrno>

// The entry: the arguments arrive as for any function (args, size, fn,
// arg); the system call takes the first two where they are. The child
// starts on its new stack with the parent's registers but rax (0) and rsp,
// so fn and arg are kept in r8 and r9, which the system call leaves alone.
// It clears the frame pointer (the outermost frame), calls fn(arg) with the
// stack 16-byte aligned as the kernel hands it over, and exits with the
// result. endbr64 is a no-op where indirect-branch tracking is off; the
// child's frame is marked as the outermost for unwinders.
#if defined(__x86_64__)
asm(R"(
  .pushsection .text
  .globl cohort_os_clone3_entry
  .hidden cohort_os_clone3_entry
  .type cohort_os_clone3_entry, @function
  .p2align 4
cohort_os_clone3_entry:
  .cfi_startproc
  endbr64
  movq %rdx, %r8
  movq %rcx, %r9
  movl $435, %eax
  syscall
  testq %rax, %rax
  jz 1f
  ret
1:
  .cfi_undefined %rip
  xorl %ebp, %ebp
  movq %r9, %rdi
  call *%r8
  movl %eax, %edi
  movl $60, %eax
  syscall
  hlt
  .cfi_endproc
  .size cohort_os_clone3_entry, .-cohort_os_clone3_entry
  .popsection
)");

extern "C" long cohort_os_clone3_entry(cohort::os::clone3_args* args, unsigned long size, int (*fn)(void*),
                                       void* arg) noexcept;
#endif

namespace cohort::os {

long clone3_run(clone3_args& args, int (*fn)(void*), void* arg) noexcept {
#if defined(__x86_64__)
  if (args.stack == 0 || args.stack_size == 0) return -EINVAL;
  return cohort_os_clone3_entry(&args, sizeof args, fn, arg);
#else
  (void)args;
  (void)fn;
  (void)arg;
  return -ENOSYS;
#endif
}

}  // namespace cohort::os
