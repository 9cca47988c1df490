"""Walking native and interpreted frames: .eh_frame parsing (ehframe), the CFI tables loaded into the BPF
walker's maps (cfi + cfi_step.h) and the HotSpot vmStructs readers that name interpreted frames
(hotspot).

Imports profiler.capture and profiler.errors.
"""
