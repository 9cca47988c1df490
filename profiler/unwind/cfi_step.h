// One unwind step through native code by its call-frame information (.eh_frame), for the stack
// walker: user space (profiler/unwind/cfi.py) parses each mapped ELF's .eh_frame into a sorted table of rows
// (first address → how to find the caller) in `cfi_rows` with a page index in `cfi_pages`, and lists
// each target process's executable file mappings (load bias, the ELF's pages) in `cfi_mappings`.
// A step is a trie lookup for the mapping, a page lookup, a short binary search among the page's rows,
// and one or two reads of the user stack.
// docs/unwinding.md explains the table and its limits.
//
// Placeholders (defaults below) replaced by profiler/unwind/cfi.py: CFI_MAX_ROWS, CFI_MAX_PAGES, CFI_MAX_BLOCKS,
// CFI_MAX_PROCS.
// Needs only bounded loops (Linux 5.3); no bpf_loop (bcc 0.26 cannot pass a callback).
//
// Contract with the walker (profiler/sampling/stack_walk.c, which defines
// `struct unwind_regs { u64 pc; u64 sp; u64 fp; }` before including this file): cfi_step(regs, tgid) returns
// one of the UNWIND_CFI_* below. `tgid` is the sampled process as the walker keyed it (current_pid_tgid(),
// profiler/bpf/pidns.py), read once per sample: inside a PID namespace each read is a map lookup and a
// helper call, which per frame would push the walker past the verifier's size limit (E2BIG).
#ifndef SPE_CFI_STEP_H
#define SPE_CFI_STEP_H

#define UNWIND_CFI_DONE 1   // regs now hold the caller's pc, sp, fp
#define UNWIND_CFI_NONE 0   // no table covers regs->pc: take the frame-pointer step
#define UNWIND_CFI_FAIL -1  // a table covers pc but the step failed: stop, mark the stack cut
#define UNWIND_CFI_END 2    // pc is in an outermost frame (_start, clone3: return address undefined): stack whole

#ifndef CFI_MAX_ROWS
#define CFI_MAX_ROWS 1048576
#endif
#ifndef CFI_MAX_PAGES
#define CFI_MAX_PAGES 1048576
#endif
#ifndef CFI_MAX_PROCS
#define CFI_MAX_PROCS 4096
#endif
#ifndef CFI_MAX_BLOCKS
#define CFI_MAX_BLOCKS 262144  // aligned blocks of all processes' mappings (a JVM needs a few hundred)
#endif
#define CFI_PAGE_SHIFT 8      // CFI_PAGE_SIZE = 256 bytes (profiler/unwind/cfi.py: PAGE_SHIFT)
#define CFI_PAGE_STEPS 7      // a page's rows are searched in 7 halvings: at most 128 (libjvm.so: 43)

// Row kinds: profiler/unwind/ehframe.py (CFA_*) has the same numbers.
#define CFI_GAP 0
#define CFI_RSP 1
#define CFI_RBP 2
#define CFI_PLT 3
#define CFI_END 4
#define CFI_UNSUPPORTED 5

// Layouts written by profiler/unwind/cfi.py (ROW, PAGE, MAPPING, MAPPING_KEY): keep both in step.
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
    u32 low;         // the ELF's first row address: page 0 starts here
    u32 first_page;  // the ELF's pages in cfi_pages: [first_page, first_page + pages)
    u32 pages;       // 0: the ELF has no .eh_frame (or no room was left): counted as no_table
    u32 pad;
};

// The rows that matter to one CFI_PAGE_SIZE slice of an ELF: the one covering its first byte and
// those starting inside it. A page index keeps the binary search short (CFI_PAGE_STEPS) and cheap to
// verify; a search over a whole ELF (libjvm.so: 190 k rows) inlined in a 128-frame walk took 560 k of
// the verifier's 1 M instructions.
struct cfi_page {
    u32 first_row;
    u32 rows;
};

// Key of cfi_mappings, a longest-prefix-match trie: the process, then the address big-endian, so one
// lookup finds the mapping holding an address (user space splits each mapping into aligned blocks).
struct cfi_mapping_key {
    u32 prefixlen;   // 32 (pid) + the block's address bits
    u32 pid;
    u64 address_be;
};

// Steps that did not take the table's path, per process: read by profiler/unwind/cfi.py for health.
struct cfi_health {
    u64 no_table;    // pc in an ELF without .eh_frame: frame-pointer step instead
    u64 miss;        // pc in an ELF with a table, but in no FDE: frame-pointer step instead
    u64 unsupported; // the FDE's rule is not one this step evaluates: stack cut
    u64 read_failed; // the return address or saved rbp could not be read: stack cut
};

BPF_ARRAY(cfi_rows, struct cfi_row, CFI_MAX_ROWS);
BPF_ARRAY(cfi_pages, struct cfi_page, CFI_MAX_PAGES);
BPF_LPM_TRIE(cfi_mappings, struct cfi_mapping_key, struct cfi_mapping, CFI_MAX_BLOCKS);
BPF_HASH(cfi_health, u32, struct cfi_health, CFI_MAX_PROCS);
BPF_PERCPU_ARRAY(cfi_steps, u64, 1);  // steps done by a table, all processes (a hash update per frame costs more)

// The row covering rel_pc: its page's rows, then the last of them starting at or below rel_pc.
static __always_inline struct cfi_row *cfi_find_row(struct cfi_mapping *map, u64 rel_pc) {
    if (rel_pc < map->low)
        return NULL;
    u64 page_index = (rel_pc - map->low) >> CFI_PAGE_SHIFT;
    if (page_index >= map->pages)
        return NULL;
    u32 page_key = map->first_page + (u32)page_index;
    struct cfi_page *page = cfi_pages.lookup(&page_key);
    if (page == NULL)
        return NULL;
    u32 base = page->first_row, len = page->rows;
    for (int i = 0; i < CFI_PAGE_STEPS; i++) {
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
        return NULL;  // more rows in one page than CFI_PAGE_STEPS can search: user space never loads such a page
    struct cfi_row *row = cfi_rows.lookup(&base);
    if (row == NULL || row->pc > rel_pc)
        return NULL;
    return row;
}

#define CFI_CAUSE_NONE 0
#define CFI_CAUSE_NO_TABLE 1
#define CFI_CAUSE_MISS 2
#define CFI_CAUSE_UNSUPPORTED 3
#define CFI_CAUSE_READ_FAILED 4

// Counts a step that left the table's path (one call site: each inlined copy costs the verifier).
static __always_inline void cfi_count(u32 tgid, u32 cause) {
    struct cfi_health *health = cfi_health.lookup(&tgid);
    if (health == NULL) {
        struct cfi_health zero = {};
        cfi_health.insert(&tgid, &zero);
        health = cfi_health.lookup(&tgid);
        if (health == NULL)
            return;
    }
    u64 *counter = &health->no_table;
    if (cause == CFI_CAUSE_MISS)
        counter = &health->miss;
    else if (cause == CFI_CAUSE_UNSUPPORTED)
        counter = &health->unsupported;
    else if (cause == CFI_CAUSE_READ_FAILED)
        counter = &health->read_failed;
    __sync_fetch_and_add(counter, 1);
}

// The rule's step, or the cause it could not be taken (CFI_CAUSE_*); UNWIND_CFI_END for outermost frames.
static __always_inline int cfi_apply(struct unwind_regs *regs, struct cfi_row *row, u32 *cause) {
    u64 cfa;
    if (row->kind == CFI_RSP)
        cfa = regs->sp + row->cfa_offset;
    else if (row->kind == CFI_RBP)
        cfa = regs->fp + row->cfa_offset;
    else if (row->kind == CFI_PLT)
        cfa = regs->sp + 8 + ((regs->pc & 15) >= row->cfa_offset ? 8 : 0);
    else if (row->kind == CFI_END)
        return UNWIND_CFI_END;
    else {
        *cause = CFI_CAUSE_UNSUPPORTED;
        return UNWIND_CFI_FAIL;
    }
    u64 ra = 0, fp = regs->fp;
    // The caller's frame is above ours: a CFA at or below sp would loop.
    if (cfa <= regs->sp || bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)) != 0) {
        *cause = CFI_CAUSE_READ_FAILED;
        return UNWIND_CFI_FAIL;
    }
    if (row->rbp_offset8 != 0 &&
        bpf_probe_read_user(&fp, sizeof(fp), (void *)(cfa + (s64)(s8)row->rbp_offset8 * 8)) != 0) {
        *cause = CFI_CAUSE_READ_FAILED;
        return UNWIND_CFI_FAIL;
    }
    regs->pc = ra;
    regs->sp = cfa;
    regs->fp = fp;
    return UNWIND_CFI_DONE;
}

static __always_inline int cfi_step(struct unwind_regs *regs, u32 tgid) {
    struct cfi_mapping_key key = {64 + 32, tgid, __builtin_bswap64(regs->pc)};
    struct cfi_mapping *map = cfi_mappings.lookup(&key);
    if (map == NULL)
        return UNWIND_CFI_NONE;  // JIT code, anonymous memory, an ELF not (yet) listed
    u32 cause = CFI_CAUSE_NONE;
    int result = UNWIND_CFI_NONE;
    if (map->pages == 0) {
        cause = CFI_CAUSE_NO_TABLE;
    } else {
        struct cfi_row *row = cfi_find_row(map, regs->pc - map->bias);
        if (row == NULL || row->kind == CFI_GAP)
            cause = CFI_CAUSE_MISS;
        else
            result = cfi_apply(regs, row, &cause);
    }
    if (cause != CFI_CAUSE_NONE) {
        cfi_count(tgid, cause);
        return result;
    }
    if (result == UNWIND_CFI_DONE) {
        u32 zero = 0;
        u64 *steps = cfi_steps.lookup(&zero);
        if (steps != NULL)
            *steps += 1;
    }
    return result;
}

#endif
