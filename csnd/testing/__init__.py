"""Infrastructure for tests, the demo and benchmarks: throwaway PostgreSQL
servers (`pgserver`), clusters of them (`cluster`), a live workload
(`pgworkload`) and wide synthetic streams (`widestream`).  Not used by the
pipeline or the service.

Public API (for tests, bench/ and `csnd demo`, not for users): the modules
in `__all__`.  Nothing is imported here.
"""

__all__ = ["cluster", "pgserver", "pgworkload", "widestream"]
