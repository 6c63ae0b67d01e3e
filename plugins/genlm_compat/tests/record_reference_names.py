"""Record the public names of genlm-backend 0.3.1 and genlm-bytes 0.2.0 into
``reference_names.json`` (what ``test_surface.py`` holds genlm-compat against).

Run with a Python that has the real releases installed, e.g. the anchor venv that
``benchmarks/bench_control.py`` builds::

    python plugins/genlm_compat/tests/record_reference_names.py benchmarks/.anchor-venv-control/bin/python

A module's public names are its ``__all__``, else every attribute not starting with
``_`` that is a ``genlm.*`` class or function (what ``from module import name`` finds
there, re-exports included; imported third-party modules and objects excluded). ``dirs``
holds what ``dir(module)`` lists (its public part), for the namespace check;
``signatures`` the parameters of each public function and of each public method (and ``__init__``, ``__call__``, ``__lshift__``,
``__getitem__``) that a ``genlm.*`` class defines, for the calls check: one string a
signature, its parameters in order, ``*args`` and ``**kwargs`` marked as in Python,
``~name`` keyword-only, ``name/`` positional-only, ``name=`` with a default.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WALK = r"""
import importlib, inspect, json, pkgutil, types
DUNDERS = ("__init__", "__call__", "__lshift__", "__getitem__")
def params(f):
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        return None
    mark = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**", "KEYWORD_ONLY": "~"}
    return " ".join(
        mark.get(p.kind.name, "") + p.name + ("/" if p.kind.name == "POSITIONAL_ONLY" else "")
        + ("=" if p.default is not inspect.Parameter.empty else "")
        for p in sig.parameters.values()
    )
out = {"versions": {d: importlib.metadata.version(d) for d in ("genlm-backend", "genlm-bytes")}, "modules": {},
       "dirs": {}, "signatures": {}}
for top in ("genlm.backend", "genlm.bytes"):
    pkg = importlib.import_module(top)
    for name in sorted([top] + [m.name for m in pkgutil.walk_packages(pkg.__path__, top + ".")]):
        mod = importlib.import_module(name)
        names = getattr(mod, "__all__", None) or [
            k for k, v in vars(mod).items()
            if not k.startswith("_") and not isinstance(v, types.ModuleType)
            and (getattr(v, "__module__", "") or "").startswith("genlm.")
        ]
        out["modules"][name] = sorted(names)
        out["dirs"][name] = sorted(k for k in dir(mod) if not k.startswith("_"))
        for n in names:
            obj = getattr(mod, n, None)
            if not (getattr(obj, "__module__", "") or "").startswith("genlm."):
                continue
            if not inspect.isclass(obj):
                if callable(obj) and (p := params(obj)) is not None:
                    out["signatures"][f"{name}:{n}"] = p
                continue
            for m, f in inspect.getmembers(obj):
                if m.startswith("_") and m not in DUNDERS:
                    continue
                owner = next((c for c in obj.__mro__ if m in vars(c)), None)
                if owner is None or not owner.__module__.startswith("genlm.") or isinstance(vars(owner)[m], property):
                    continue
                if (p := params(f)) is not None:
                    out["signatures"][f"{name}:{n}.{m}"] = p
print(json.dumps(out, indent=1, sort_keys=True))
"""


def main() -> None:
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    text = subprocess.run(
        [python, "-c", "import importlib.metadata\n" + WALK], check=True, capture_output=True, text=True
    ).stdout
    (Path(__file__).parent / "reference_names.json").write_text(text)


if __name__ == "__main__":
    main()
