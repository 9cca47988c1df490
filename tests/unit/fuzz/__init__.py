"""Property-based fuzzing of the parsers of target and capture bytes (issue 46, item 7).

Each test draws inputs from a seed corpus of real bytes (tests/data/fuzz/, README there), mutated, and from
plain random bytes, and holds that the parser returns or raises the error its caller catches, within a
deadline. Reproducible in the suite (derandomize, a fixed number of examples); run longer with
``SPE_FUZZ_EXAMPLES=20000`` (random, not derandomized, ``SPE_FUZZ_SECONDS`` per example deadline).
"""
