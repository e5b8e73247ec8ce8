"""Shared test configuration: hypothesis profiles.

* ``default`` (CI): 200 examples per property, no deadline (CI machines are noisy).
* ``long``: 5 000 examples per property — ``HYPOTHESIS_PROFILE=long make test``.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
