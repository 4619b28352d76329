"""Infrastructure for tests, the demo and benchmarks: throwaway PostgreSQL
servers (`pgserver`) and a live workload (`pgworkload`).  Not used by the
pipeline or the service."""
