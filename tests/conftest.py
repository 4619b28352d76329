"""Settings every test shares.

Hypothesis: no per-example deadline and no "too slow" health check.  The
suite runs on a shared 2-core machine beside real servers, a JVM and its own
subprocesses; an example that takes 300 ms there is load, not a defect, and
timing goals are benchmarks in bench/, never assertions in tests.  A test's
own `@settings` still sets its example counts.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("csnd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("csnd")
