"""pluggy hook specifications: one callback-style registration hook per protocol kind.

A plugin module (named by an entry point in the ``genlm_core`` group) implements
any of these hooks and calls ``register`` for each implementation it provides::

    from genlm_core import hookimpl

    @hookimpl
    def genlm_register_backends(register):
        register(
            "mybackend",
            "my_plugin.backend:MyBackend",      # import string: nothing imported yet
            config="my_plugin.config:MyConfig",   # optional, light module
            devices=["cuda", "cpu"],
            priority={"cuda": 80},                 # used by load("auto")
            aliases=["mb"],
            requires=["my_engine"],                # modules that must be importable
            install="pip install my-plugin[engine]",
        )

New keyword arguments may be added to the hooks later; pluggy passes a hook
implementation only the arguments it names, so old plugins keep working.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "genlm_core"
ENTRY_POINT_GROUP = "genlm_core"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[..., Any]


class GenlmHookSpecs:
    """The hooks a genlm-core plugin may implement."""

    @hookspec
    def genlm_register_backends(self, register: Register) -> None:
        """Register LogprobBackend implementations."""

    @hookspec
    def genlm_register_tries(self, register: Register) -> None:
        """Register Trie implementations."""

    @hookspec
    def genlm_register_caches(self, register: Register) -> None:
        """Register Cache implementations."""

    @hookspec
    def genlm_register_byte_models(self, register: Register) -> None:
        """Register ByteModel implementations."""

    @hookspec
    def genlm_doctor(self, hardware: Any) -> dict[str, Any] | None:
        """This plugin's section of ``genlm doctor``, or None for none.

        ``hardware`` is :func:`genlm_core.registry.hardware.probe`'s result. Return
        ``{"title": str, "lines": [str, ...], "data": {...}}``: the title and lines are
        printed, ``data`` (JSON-serialisable) appears under ``sections`` in
        ``genlm doctor --json``. Must import no engine (doctor runs without one).
        """


#: registration hook name -> protocol kind it registers (other hooks: ``genlm_doctor``)
HOOK_KINDS = {
    "genlm_register_backends": "backend",
    "genlm_register_tries": "trie",
    "genlm_register_caches": "cache",
    "genlm_register_byte_models": "byte_model",
}
