"""Environment switches read on every call (so they can change at run time), parsed once per raw value."""

from __future__ import annotations

import os


class EnvChoice:
    """``EnvChoice("MINITE_X", ("a", "b"), default="a")()`` -> the lower-cased, stripped value of
    ``$MINITE_X`` (``default`` when unset); an invalid value raises ``ValueError`` naming the variable and
    the choices."""

    __slots__ = ("choices", "default", "name", "_memo")

    def __init__(self, name: str, choices: tuple[str, ...], default: str) -> None:
        if default not in choices:
            raise ValueError(f"{name}: default {default!r} is not one of {list(choices)}")
        self.name, self.choices, self.default = name, tuple(choices), default
        self._memo: tuple[str | None, str] = (None, default)  # (raw, parsed) of the last valid read

    def __call__(self) -> str:
        raw = os.environ.get(self.name, self.default)
        memo = self._memo
        if raw == memo[0]:
            return memo[1]
        mode = raw.strip().lower()
        if mode not in self.choices:
            raise ValueError(f"{self.name}={raw!r} is not valid; choose one of {list(self.choices)}")
        self._memo = (raw, mode)  # one atomic rebinding: readers never see a half-updated pair
        return mode
