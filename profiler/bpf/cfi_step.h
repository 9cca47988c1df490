// CFI step of the stack walker (profiler/bpf/stack_walk.c): unwinds one frame of code that has no frame
// pointers from call-frame information, before the walker falls back to its frame-pointer step.
//
// Contract with the walker:
//   struct unwind_regs { u64 pc; u64 sp; u64 fp; };   defined by stack_walk.c before including this file
//   cfi_step(regs) returns
//     UNWIND_CFI_DONE  regs now hold the caller's pc, sp, fp
//     UNWIND_CFI_NONE  no table covers regs->pc: the walker takes the frame-pointer step
//     UNWIND_CFI_FAIL  a table covers pc but the step failed: the walk stops, the stack is marked cut
//
// This is the stub (no tables: every pc takes the frame-pointer step). Issue 21 part 1 replaces the body
// (and adds its maps here).
#ifndef SPE_CFI_STEP_H
#define SPE_CFI_STEP_H

#define UNWIND_CFI_DONE 1   /* regs now hold the caller's pc, sp, fp */
#define UNWIND_CFI_NONE 0   /* no table covers regs->pc: take the frame-pointer step */
#define UNWIND_CFI_FAIL -1  /* a table covers pc but the step failed: stop, mark the stack cut */

static __always_inline int cfi_step(struct unwind_regs *regs) {
    return UNWIND_CFI_NONE;
}

#endif
