"""Walking native and interpreted frames: .eh_frame parsing (ehframe), the CFI tables loaded into the BPF
walker's maps (cfi + cfi_step.h) a JVM's layout read from its vmStructs (vmstructs), its
hsperfdata counters (hsperf), its code cache (codecache) and the namers of interpreted and compiled frames
(hotspot).

Imports profiler.capture and profiler.errors.
"""
