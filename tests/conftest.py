"""Suite-wide test settings.

Under CI (CI=true) Hypothesis runs derandomized: the same examples on every run, so a landing is never decided
by which random cases came up. Locally it explores new examples each run (and keeps failures in its database).
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
