// One unwind step through native code by its call-frame information (.eh_frame), for the stack
// walker: user space (profiler/cfi.py) parses each mapped ELF's .eh_frame into a sorted table of rows
// (first address → how to find the caller) in `cfi_rows`, and lists each target process's executable
// file mappings (address range, load bias, the ELF's row range) sorted by address in `cfi_procs`.
// A step is two bounded binary searches (mapping, then row) and one or two reads of the user stack.
// docs/unwinding.md explains the table and its limits.
//
// Placeholders (defaults below) replaced by profiler/cfi.py: CFI_MAX_ROWS, CFI_MAX_PROCS.
// Needs only bounded loops (Linux 5.3); no bpf_loop (bcc 0.26 cannot pass a callback).

#ifndef CFI_STEP_H
#define CFI_STEP_H

#ifndef UNWIND_REGS_DECLARED
#define UNWIND_REGS_DECLARED
struct unwind_regs {
    u64 pc;
    u64 sp;
    u64 fp;
};
#endif

#define UNWIND_CFI_DONE 1   // regs now hold the caller's pc, sp, fp
#define UNWIND_CFI_NONE 0   // no table covers regs->pc: take the frame-pointer step
#define UNWIND_CFI_FAIL -1  // a table covers pc but the step failed: stop, mark the stack cut
#define UNWIND_CFI_END 2    // pc is in an outermost frame (_start, clone3: return address undefined): stack whole

#ifndef CFI_MAX_ROWS
#define CFI_MAX_ROWS 1048576
#endif
#ifndef CFI_MAX_PROCS
#define CFI_MAX_PROCS 4096
#endif
#define CFI_MAX_MAPPINGS 128  // a power of two: indexes are masked with it (profiler/cfi.py: MAX_MAPPINGS)
#define CFI_MAPPING_STEPS 8   // log2(CFI_MAX_MAPPINGS) + 1
#define CFI_ROW_STEPS 22      // log2(CFI_MAX_ROWS) + 1 for up to 4 M rows in one ELF

// Keeps clang from dropping a mask it can prove redundant but the verifier cannot.
#define CFI_BARRIER(var) asm volatile("" : "+r"(var))

// Row kinds: profiler/ehframe.py (CFA_*) has the same numbers.
#define CFI_GAP 0
#define CFI_RSP 1
#define CFI_RBP 2
#define CFI_PLT 3
#define CFI_END 4
#define CFI_UNSUPPORTED 5

// Layouts written by profiler/cfi.py (ROW, MAPPING, PROC): keep both in step.
struct cfi_row {
    u32 pc;          // first address the row covers, relative to the ELF's virtual addresses
    u16 cfa_offset;  // CFA = base register + cfa_offset (PLT: the slot offset where the push happened)
    u8 kind;         // CFI_*
    u8 rbp_offset8;  // an s8 (bcc has no ctype for it): rbp saved at CFA + 8 * rbp_offset8; 0: unchanged
};

struct cfi_mapping {
    u64 start;       // executable mapping [start, end) in the process
    u64 end;
    u64 bias;        // address in the process - address in the ELF
    u32 first_row;   // the ELF's rows in cfi_rows: [first_row, first_row + rows)
    u32 rows;        // 0: the ELF has no .eh_frame (or no room was left): counted as no_table
};

struct cfi_proc {
    u32 count;       // mappings used, sorted by start
    u32 generation;  // bumped by user space on each rewrite (diagnostics only)
    struct cfi_mapping maps[CFI_MAX_MAPPINGS];
};

// Steps that did not take the table's path, per process: read by profiler/cfi.py for health.
struct cfi_health {
    u64 no_table;    // pc in an ELF without .eh_frame: frame-pointer step instead
    u64 miss;        // pc in an ELF with a table, but in no FDE: frame-pointer step instead
    u64 unsupported; // the FDE's rule is not one this step evaluates: stack cut
    u64 read_failed; // the return address or saved rbp could not be read: stack cut
};

BPF_ARRAY(cfi_rows, struct cfi_row, CFI_MAX_ROWS);
BPF_HASH(cfi_procs, u32, struct cfi_proc, CFI_MAX_PROCS);
BPF_HASH(cfi_health, u32, struct cfi_health, CFI_MAX_PROCS);
BPF_PERCPU_ARRAY(cfi_steps, u64, 1);  // steps done by a table, all processes (a hash update per frame costs more)

// The mapping holding pc: the last one starting at or below it, if pc is before its end.
static __always_inline struct cfi_mapping *cfi_find_mapping(struct cfi_proc *proc, u64 pc) {
    u32 len = proc->count;
    if (len == 0 || len > CFI_MAX_MAPPINGS)
        return NULL;
    u32 base = 0;
#pragma unroll
    for (int i = 0; i < CFI_MAPPING_STEPS; i++) {
        if (len <= 1)
            break;
        u32 half = len >> 1;
        u32 index = base + half;
        CFI_BARRIER(index);
        if (proc->maps[index & (CFI_MAX_MAPPINGS - 1)].start <= pc)
            base = index;
        len -= half;
    }
    CFI_BARRIER(base);
    struct cfi_mapping *map = &proc->maps[base & (CFI_MAX_MAPPINGS - 1)];
    if (pc < map->start || pc >= map->end)
        return NULL;
    return map;
}

// The row covering rel_pc among rows [first, first + count): the last one starting at or below it.
static __always_inline struct cfi_row *cfi_find_row(u32 first, u32 count, u32 rel_pc) {
    u32 base = first, len = count;
    for (int i = 0; i < CFI_ROW_STEPS; i++) {
        if (len <= 1)
            break;
        u32 half = len >> 1;
        u32 index = base + half;
        struct cfi_row *row = cfi_rows.lookup(&index);
        if (row == NULL)
            return NULL;
        if (row->pc <= rel_pc)
            base = index;
        len -= half;
    }
    if (len > 1)
        return NULL;  // more rows than CFI_ROW_STEPS can search: user space never loads such a table
    struct cfi_row *row = cfi_rows.lookup(&base);
    if (row == NULL || row->pc > rel_pc)
        return NULL;
    return row;
}

static __always_inline void cfi_count(u32 tgid, int field) {
    struct cfi_health *health = cfi_health.lookup(&tgid);
    if (health == NULL) {
        struct cfi_health zero = {};
        cfi_health.insert(&tgid, &zero);
        health = cfi_health.lookup(&tgid);
        if (health == NULL)
            return;
    }
    switch (field) {
    case 1: __sync_fetch_and_add(&health->no_table, 1); break;
    case 2: __sync_fetch_and_add(&health->miss, 1); break;
    case 3: __sync_fetch_and_add(&health->unsupported, 1); break;
    default: __sync_fetch_and_add(&health->read_failed, 1); break;
    }
}

static __always_inline int cfi_step(struct unwind_regs *regs) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct cfi_proc *proc = cfi_procs.lookup(&tgid);
    if (proc == NULL)
        return UNWIND_CFI_NONE;
    struct cfi_mapping *map = cfi_find_mapping(proc, regs->pc);
    if (map == NULL)
        return UNWIND_CFI_NONE;  // JIT code, anonymous memory, an ELF not (yet) listed
    if (map->rows == 0) {
        cfi_count(tgid, 1);
        return UNWIND_CFI_NONE;
    }
    u64 rel_pc = regs->pc - map->bias;
    struct cfi_row *row = rel_pc >> 32 ? NULL : cfi_find_row(map->first_row, map->rows, (u32)rel_pc);
    if (row == NULL || row->kind == CFI_GAP) {
        cfi_count(tgid, 2);
        return UNWIND_CFI_NONE;
    }
    u64 cfa;
    switch (row->kind) {
    case CFI_RSP:
        cfa = regs->sp + row->cfa_offset;
        break;
    case CFI_RBP:
        cfa = regs->fp + row->cfa_offset;
        break;
    case CFI_PLT:
        cfa = regs->sp + 8 + ((regs->pc & 15) >= row->cfa_offset ? 8 : 0);
        break;
    case CFI_END:
        return UNWIND_CFI_END;
    default:
        cfi_count(tgid, 3);
        return UNWIND_CFI_FAIL;
    }
    u64 ra = 0, fp = regs->fp;
    // The caller's frame is above ours: a CFA at or below sp would loop.
    if (cfa <= regs->sp || bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)) != 0) {
        cfi_count(tgid, 4);
        return UNWIND_CFI_FAIL;
    }
    if (row->rbp_offset8 != 0 &&
        bpf_probe_read_user(&fp, sizeof(fp), (void *)(cfa + (s64)(s8)row->rbp_offset8 * 8)) != 0) {
        cfi_count(tgid, 4);
        return UNWIND_CFI_FAIL;
    }
    u32 zero = 0;
    u64 *steps = cfi_steps.lookup(&zero);
    if (steps != NULL)
        *steps += 1;
    regs->pc = ra;
    regs->sp = cfa;
    regs->fp = fp;
    return UNWIND_CFI_DONE;
}

#endif
