"""A reward's behaviour: its outputs on a fixed, seeded probe drawn from the run's own data.

A description of a reward (``lm/_describe.py``) cannot see everything a Python
callable may depend on: a global it reads, an object with no readable content,
state nested past what a description follows. Such a reward is also identified
by what it returns on a probe: a few rows of the run's prompts, each with a
completion drawn from the run's own texts (its prompts and its columns' values)
and the row's columns. The probe is drawn with a fixed seed, so it is the same
in every process that runs the same script on the same data.
"""

from __future__ import annotations

import numpy as np

from ._combined import call_with_columns

__all__ = ["reward_behaviour"]

# Rows in the probe; a reward that differs from another on none of them is not told apart.
PROBE_ROWS = 8


def _text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list) and value and isinstance(value[-1], dict):  # a conversation
        content = value[-1].get("content")
        return content if isinstance(content, str) else None
    return None


def probe_inputs(prompts, columns: dict | None = None, n: int = PROBE_ROWS):
    """The probe's prompts, completions and columns, drawn with a fixed seed.

    Parameters
    ----------
    prompts : list
        The run's prompts.
    columns : dict of str to list, default=None
        The prompt table's other columns.
    n : int, default=8
        Rows in the probe.

    Returns
    -------
    prompts, completions : list
    columns : dict of str to list

    Examples
    --------
    >>> p, c, cols = probe_inputs(["1+1=", "2+2="], {"answer": ["2", "4"]}, n=2)
    >>> sorted(p), len(c), sorted(cols)
    (['1+1=', '2+2='], 2, ['answer'])
    """
    columns = columns or {}
    rng = np.random.RandomState(0)
    rows = rng.choice(len(prompts), size=min(n, len(prompts)), replace=False)
    texts = [t for v in [*prompts, *(x for c in columns.values() for x in c)] if (t := _text(v))]
    pool = ["", *dict.fromkeys(texts)]
    completions = [pool[i] for i in rng.randint(len(pool), size=len(rows))]
    picked = {name: [values[i] for i in rows] for name, values in columns.items()}
    return [prompts[i] for i in rows], completions, picked


def reward_behaviour(reward, prompts, columns: dict | None = None) -> dict:
    """What ``reward`` returns on the run's probe: part of the run identity.

    The outputs are rounded to 9 significant digits. A reward that raises on
    the probe is called row by row, and a row it raises on is described by the
    error's type (the fit then meets the same error with its own message).

    Parameters
    ----------
    reward : callable
        ``reward(prompts, completions, **columns)``, called as a fit calls it.
    prompts : list
        The run's prompts.
    columns : dict of str to list, default=None
        The prompt table's other columns.

    Returns
    -------
    behaviour : dict
        JSON data: ``{"outputs": [...]}``, a number or ``{"error": "<type>"}``
        per row.

    Examples
    --------
    >>> reward_behaviour(lambda p, c: [len(x) for x in c], ["ab", "abc"])
    {'outputs': [2.0, 0.0]}
    """
    p, c, cols = probe_inputs(prompts, columns)
    try:
        return {"outputs": _outputs(reward, p, c, cols)}
    except Exception:  # noqa: BLE001 - one bad row: each row alone, so the others still count
        pass
    rows = []
    for i in range(len(p)):
        try:
            rows.extend(_outputs(reward, p[i : i + 1], c[i : i + 1], _row(cols, i)))
        except Exception as exc:  # noqa: BLE001 - the failure identifies it; the fit reports it
            rows.append({"error": type(exc).__qualname__})
    return {"outputs": rows}


def _row(columns: dict, i: int) -> dict:
    return {name: values[i : i + 1] for name, values in columns.items()}


def _outputs(reward, prompts, completions, columns) -> list:
    raw = call_with_columns(reward, prompts, completions, columns)
    raw = raw.detach().cpu() if hasattr(raw, "detach") else raw
    values = np.asarray(raw, dtype=np.float64).ravel()
    # JSON has no NaN equal to itself: a non-finite output by its text.
    return [float(f"{v:.9g}") if np.isfinite(v) else repr(v) for v in values.tolist()]
