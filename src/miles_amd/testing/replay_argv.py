"""The replay's argv check: rebuild a :class:`Recipe` from a ``train.py`` argv and refuse any
argv that is not exactly that recipe's.

Decides, before the replay writes anything: the argv is the recipe's, token for token
(:func:`check_argv`): a :class:`~miles_amd.recipe.settings.Recipe` is rebuilt from it
(:func:`recipe_from_argv`) and its ``argv()`` must equal the given argv, so a foreign flag, a
changed pinned value, a missing flag or a different order is refused naming the flag
(:func:`argv_difference`); the recipe's own invariants (``RecipeError``) refuse too. Which
flag carries which field is the recipe's own declaration (``recipe.settings.SETTINGS``), so a
new setting needs nothing here. Does not read the source run or write evidence
(``miles_amd.testing.replay``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import get_origin, get_type_hints

from miles_amd.recipe.settings import SETTINGS, Recipe, RecipeError, Setting

Flag = tuple[str, tuple[str, ...]]


class ReplayRefused(ValueError):
    """The replay will not run; the message names the flag, variable or file and the fix."""


def split_flags(argv: Sequence[str]) -> list[Flag]:
    """``["--a", "1", "--b"]`` -> ``[("--a", ("1",)), ("--b", ())]``; a leading value refuses."""
    flags: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            flags.append((token, []))
        elif not flags:
            raise ReplayRefused(f"{token}: a value before any flag; pass the recipe's argv")
        else:
            flags[-1][1].append(token)
    return [(flag, tuple(values)) for flag, values in flags]


def _flag_map(flags: Sequence[Flag]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for flag, values in flags:
        if flag in out:
            raise ReplayRefused(f"{flag}: given twice; the recipe passes it once")
        out[flag] = values
    return out


def _one_value(flags: Mapping[str, tuple[str, ...]], flag: str) -> str | None:
    values = flags.get(flag)
    if values is None:
        return None
    if len(values) != 1:
        raise ReplayRefused(f"{flag}: takes one value, got {len(values)}")
    return values[0]


def _parent(path: str, levels: int) -> str:
    for _ in range(levels):
        path = path.rpartition("/")[0]
    return path


def recipe_from_argv(argv: Sequence[str]) -> Recipe:
    """The recipe whose ``argv()`` the given argv would be, read field by field.

    Each field is read from the first flag its :class:`~miles_amd.recipe.settings.Setting`
    declares: a bool is on when its flag is present (off, for a ``negated`` one), a tuple is
    split on commas, a directory is the path its ``under`` levels above the value
    (``model_dir`` the parent of ``--hf-checkpoint``), anything else converted to the field's
    type. A flag the recipe derives but the argv lacks keeps the field's default, and flags
    the recipe does not know are ignored here (:func:`check_argv` refuses both by comparing
    argvs). ``ReplayRefused`` for an unreadable value, ``RecipeError`` for a broken
    invariant. The hardware is not in the argv (MI355X and MI350X run the same argv).
    """
    flags = _flag_map(split_flags(argv))
    types = get_type_hints(Recipe)
    values: dict[str, object] = {}
    for name, declared in SETTINGS.items():
        if not declared.argv:
            continue
        flag, kind = declared.argv[0], types[name]
        if kind is bool:
            values[name] = (flag in flags) != declared.negated
        elif (raw := _one_value(flags, flag)) is not None:
            values[name] = _read(flag, raw, kind, declared)
    return Recipe(**values)  # type: ignore[arg-type]


def _read(flag: str, raw: str, kind: type, declared: Setting) -> object:
    if get_origin(kind) is tuple:
        return tuple(raw.split(","))
    if declared.under:
        return _parent(raw, declared.under.count("/") + 1)
    try:
        return kind(raw)
    except ValueError:
        raise ReplayRefused(f"{flag} {raw}: not a valid {kind.__name__}") from None


def argv_difference(expected: Sequence[str], given: Sequence[str]) -> str | None:
    """The first difference between two argvs, worded by flag; ``None`` if they are equal."""
    want, got = split_flags(expected), split_flags(given)
    want_flags = {flag for flag, _ in want}
    got_flags = {flag for flag, _ in got}
    for index in range(max(len(want), len(got))):
        w = want[index] if index < len(want) else None
        g = got[index] if index < len(got) else None
        if w == g:
            continue
        if g is not None and g[0] not in want_flags:
            return f"{g[0]}: not a flag of the recipe; the replay takes the recipe's argv only"
        if w is not None and w[0] not in got_flags:
            return f"{w[0]}: missing; the recipe passes {' '.join((w[0], *w[1]))}"
        if w is not None and g is not None and w[0] == g[0]:
            return (
                f"{' '.join((g[0], *g[1]))}: the recipe passes {' '.join((w[0], *w[1]))} "
                "(only recipe options change argv values)"
            )
        assert w is not None and g is not None
        return f"{g[0]}: out of the recipe's order (the recipe passes {w[0]} here)"
    return None


def check_argv(argv: Sequence[str]) -> Recipe:
    """The recipe of ``argv`` if ``argv`` is exactly its ``argv()``; ``ReplayRefused`` if not."""
    try:
        recipe = recipe_from_argv(argv)
    except RecipeError as exc:
        raise ReplayRefused(f"the recipe rejects this argv: {exc}") from None
    difference = argv_difference(recipe.argv(), argv)
    if difference is not None:
        raise ReplayRefused(difference)
    return recipe
