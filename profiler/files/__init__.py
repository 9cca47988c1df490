"""Files the host agent reads and writes, each by one rule: the user's text inputs (UTF-8 with an optional
BOM, bounded sizes: ``textinput``), output paths and what ``--force`` may replace (``outputs``), atomic
writes of a file or a whole directory (``atomic``), and a target's files, links and binaries, never acted
on with root's rights (``safeio``, docs/security.md).

May import: profiler.errors and the standard library only; every room above may import it."""
