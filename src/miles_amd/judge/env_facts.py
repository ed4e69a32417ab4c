"""Whether an ``env.json`` can be believed: its facts well formed, consistent and all ok.

``env.json`` is what ``miles-amd preflight`` found on the node (``run.preflight.
write_env_json``): a list of facts, each ``name``, ``status`` (``ok``/``missing``/``wrong``,
``run.facts.FactStatus``) and ``value``; ``ok``, true exactly when every fact is ``ok``; and
``aiter_variant``, the value of the ``aiter_variant`` fact when that is ``ok``. A run dir is
untrusted input, so before the hardware identity is read from it (``judge.environment``),
this module lists what makes it unbelievable:

- a fact that is not an object with a string ``name``, a known ``status`` and a string
  ``value``;
- the same fact twice (two ``gpus`` readings: which one is the node?);
- ``ok`` that is not a boolean or disagrees with the facts' statuses;
- a top-level ``aiter_variant`` other than the ``aiter_variant`` fact's value;
- a failed fact (status ``missing`` or ``wrong``): the preflight said this node cannot run
  the recipe, so a run there does not vouch for it.

Any of these fails the ``environment.identity`` check, with or without ``--require-env``.
Pure; decides nothing about identity (``judge.environment``).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["env_json_problems"]

_STATUSES = ("ok", "missing", "wrong")


def env_json_problems(env: Mapping[str, object]) -> list[str]:
    """What makes ``env``'s facts unbelievable (see the module doc); [] when nothing does."""
    facts = env.get("facts")
    if not isinstance(facts, list):
        return ['"facts" is not a list of the preflight\'s facts']
    problems: list[str] = []
    seen: dict[str, Mapping[str, object]] = {}
    for index, fact in enumerate(facts):
        if not (
            isinstance(fact, Mapping)
            and isinstance(fact.get("name"), str)
            and fact.get("status") in _STATUSES
            and isinstance(fact.get("value"), str)
        ):
            problems.append(f"facts[{index}] is not a fact (name, status ok|missing|wrong, value)")
            continue
        name = str(fact["name"])
        if name in seen:
            problems.append(f"fact {name!r} recorded twice (contradictory)")
            continue
        seen[name] = fact
        if fact["status"] != "ok":
            problems.append(
                f"fact {name!r} is {fact['status']}: {fact.get('message') or 'no message'}"
            )
    if problems:
        return problems
    all_ok = bool(seen) and all(f["status"] == "ok" for f in seen.values())
    if env.get("ok") is not all_ok:
        problems.append(f'"ok" is {env.get("ok")!r} but the facts say {all_ok}')
    variant_fact = seen.get("aiter_variant")
    recorded = env.get("aiter_variant")
    if variant_fact is not None and recorded is not None and recorded != variant_fact["value"]:
        problems.append(
            f'"aiter_variant" is {recorded!r} but the aiter_variant fact says '
            f"{variant_fact['value']!r}"
        )
    return problems
