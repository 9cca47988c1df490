/* A crafted "libjvm.so" (issue 27's hostile process): it exports HotSpot's vmStructs symbols with
 * absurd strides, counts, offsets and strings, and HotSpot's thread-naming function, so that a root
 * profiler reading it must bound everything it reads. Built by tests/fixtures/hostile.py with
 *   gcc -shared -fPIC -o lib/server/libjvm.so fake_libjvm.c
 */
#include <stdint.h>
#include <string.h>

struct entry {
    const char *type_name;
    const char *field_name;
    const char *type_string;
    int32_t is_static;
    uint64_t offset;
    void *address;
};

static char huge_name[1 << 16];  /* a 64 KB "type name" without its NUL */
static struct entry structs[2];  /* never the end marker that HotSpot's tables carry */
static struct entry types[2];

/* Stride 0: every entry is the first one, forever. */
uint64_t gHotSpotVMStructEntryArrayStride = 0;
uint64_t gHotSpotVMStructEntryTypeNameOffset = 0;
uint64_t gHotSpotVMStructEntryFieldNameOffset = 8;
uint64_t gHotSpotVMStructEntryTypeStringOffset = 16;
uint64_t gHotSpotVMStructEntryIsStaticOffset = 24;
uint64_t gHotSpotVMStructEntryOffsetOffset = 1ULL << 46;  /* far outside the entry */
uint64_t gHotSpotVMStructEntryAddressOffset = 1ULL << 62;
void *gHotSpotVMStructs = structs;

/* A stride past the end of user space. */
uint64_t gHotSpotVMTypeEntryArrayStride = 1ULL << 47;
uint64_t gHotSpotVMTypeEntryTypeNameOffset = 0;
uint64_t gHotSpotVMTypeEntrySizeOffset = 0xfffffffffffffff0ULL;
void *gHotSpotVMTypes = types;

uint64_t gHotSpotVMIntConstantEntryArrayStride = 8;
uint64_t gHotSpotVMIntConstantEntryNameOffset = 0;
uint64_t gHotSpotVMIntConstantEntryValueOffset = 8;
void *gHotSpotVMIntConstants = huge_name;  /* "entries" whose name pointers are 'A' bytes */

__attribute__((constructor)) static void fill(void) {
    memset(huge_name, 'A', sizeof(huge_name));
    for (int i = 0; i < 2; i++) {
        structs[i] = (struct entry){huge_name, huge_name, huge_name, 7, 0, huge_name};
        types[i] = (struct entry){huge_name, huge_name, huge_name, 0, 0, 0};
    }
}

/* os::set_native_thread_name(const char*): the profiler's uprobe reads the name it is given. */
void _ZN2os22set_native_thread_nameEPKc(const char *name) {
    __asm__ volatile("" : : "r"(name) : "memory");
}
