"""Environment switches read on every call (so they can change at run time), parsed once per raw value.

They sit on the learner's hot path (a few reads per quantized linear, ~200 linears per step), so the read
goes to ``os.environ``'s backing dict with the pre-encoded key (``os._Environ._data``: what
``os.environ.get`` consults after encoding the key on every call); ``os.environ.get`` is the fallback where
that attribute does not exist. Changes made through ``os.environ`` (``monkeypatch.setenv``, ``os.environ[k]
= v``, ``del os.environ[k]``) are seen at the next call either way.
"""

from __future__ import annotations

import os


class EnvChoice:
    """``EnvChoice("MINITE_X", ("a", "b"), default="a")()`` -> the lower-cased, stripped value of
    ``$MINITE_X`` (``default`` when unset); an invalid value raises ``ValueError`` naming the variable and
    the choices."""

    __slots__ = ("_key", "_memo", "choices", "default", "name")

    def __init__(self, name: str, choices: tuple[str, ...], default: str) -> None:
        if default not in choices:
            raise ValueError(f"{name}: default {default!r} is not one of {list(choices)}")
        self.name, self.choices, self.default = name, tuple(choices), default
        encode = getattr(os.environ, "encodekey", None)
        self._key = encode(name) if encode is not None else None
        self._memo: tuple[object, str] = (None, default)  # (raw, parsed) of the last valid read

    def __call__(self) -> str:
        data = getattr(os.environ, "_data", None)
        raw = data.get(self._key) if data is not None and self._key is not None else os.environ.get(self.name)
        memo = self._memo
        if raw == memo[0]:
            return memo[1]
        text = os.environ.get(self.name, self.default)
        mode = text.strip().lower()
        if mode not in self.choices:
            raise ValueError(f"{self.name}={text!r} is not valid; choose one of {list(self.choices)}")
        self._memo = (raw, mode)  # one atomic rebinding: readers never see a half-updated pair
        return mode
