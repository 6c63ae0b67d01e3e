"""The test kit's model paths under the name the core suites import
(``genlm_core.testing.models``; plugin suites use the kit's fixtures)."""

from genlm_core.testing.models import *  # noqa: F403
from genlm_core.testing.models import __all__, __getattr__  # noqa: F401
