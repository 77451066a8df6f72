"""Run a callback once a module is imported, without importing it: the torch and transformers
integrations register themselves when (and only when) the caller imports those packages, so
``import ferrattn`` stays numpy-only and fast."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

_pending = {}


def _fire(name):
    for cb in _pending.pop(name, []):
        try:
            cb()
        except Exception as e:  # an integration must never break the caller's import
            warnings.warn(f"ferrattn: registering with {name} failed: {e}", RuntimeWarning)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _fire(self.name)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, fullname)
        return spec


_finder = _Finder()


def on_import(name, callback):
    """``callback()`` now if ``name`` is imported, else right after its import finishes."""
    if name in sys.modules:
        _pending.setdefault(name, []).append(callback)
        _fire(name)
        return
    _pending.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
