"""The plugin registry: hooks, discovery, resolution by name and by hardware.

What lives here (none of it imports an engine):

* :mod:`~genlm_core.registry.hookspecs` - the pluggy hooks a plugin implements
  (``genlm_register_backends(register)``, ..., ``genlm_doctor(hardware)``).
* :mod:`~genlm_core.registry.entries` - what a registration is (an import string with
  devices, priorities, requirements and an install hint) and the registry's errors.
* :mod:`~genlm_core.registry.discovery` - :class:`Registry`: entry points in, broken
  plugins reported, ``"auto"`` resolved; :func:`get_registry` is the process-wide one.
* :mod:`~genlm_core.registry.hardware` - cheap device probes (no torch).
* :mod:`~genlm_core.registry.core_plugin` - the core's own caches, tries and byte model,
  registered through the same hooks as any plugin.
* :mod:`~genlm_core.registry.distributions` - the genlm distributions installed here.
"""

from genlm_core.registry.discovery import Registry, get_registry
from genlm_core.registry.entries import (
    FIRST_PARTY,
    BrokenPlugin,
    PluginError,
    Registration,
    UnavailableImplementationError,
    UnknownImplementationError,
)

__all__ = [
    "FIRST_PARTY",
    "BrokenPlugin",
    "PluginError",
    "Registration",
    "Registry",
    "UnavailableImplementationError",
    "UnknownImplementationError",
    "get_registry",
]
