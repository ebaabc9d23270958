"""The ``prefopt-api`` directive: one group of the API reference, names from ``__all__``.

``.. prefopt-api:: prefopt.metrics`` documents every name in ``prefopt.metrics.__all__``: a
table of names and summaries, then each object. ``:names:`` gives a hand list instead, for
groups that take part of a module's ``__all__`` (dotted names reach into submodules:
``rewards.check_rewards``). After reading, every name exported by the modules in
``prefopt_api_modules`` must be documented somewhere, or the build warns (and ``-W`` fails):
a new public name cannot be left out of the reference by accident.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


def _resolve(name: str):
    """Import ``a.b.C`` as the attribute ``C`` of the deepest importable module."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def _public_names(module) -> list[str]:
    """``module.__all__`` without submodules and dunder names (``__version__``)."""
    return [
        n
        for n in module.__all__
        if not n.startswith("__") and not inspect.ismodule(getattr(module, n))
    ]


def _comment_above(module, name: str) -> list[str]:
    """The ``#`` comment block above ``NAME = ...`` in the package's source, if any.

    A constant's own docstring would be its type's (a tuple's), so a constant is
    described by the comment that precedes its assignment, wherever it is defined.
    """
    short = name.rsplit(".", 1)[1]
    root = Path(importlib.import_module(module.__name__.split(".")[0]).__file__).parent
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(rf"{re.escape(short)}\s*(:[^=]*)?=", line):
                j = i
                while j > 0 and lines[j - 1].startswith("#"):
                    j -= 1
                if j < i:
                    return [c.lstrip("#").strip() for c in lines[j:i]]
    return []


class PrefoptAPI(SphinxDirective):
    required_arguments = 1
    has_content = False
    option_spec = {"names": directives.unchanged_required}

    def run(self) -> list[nodes.Node]:
        modname = self.arguments[0]
        module = importlib.import_module(modname)
        if "names" in self.options:
            names = self.options["names"].split()
        else:
            names = _public_names(module)
        full = [f"{modname}.{n}" for n in names]
        documented = self.env.prefopt_api_documented = getattr(
            self.env, "prefopt_api_documented", {}
        )
        documented.setdefault(self.env.docname, set()).update(full)

        table = [".. list-table::", "   :widths: 35 65", ""]
        entries = []
        for name in full:
            obj = _resolve(name)
            if inspect.isclass(obj) or callable(obj):
                doc = (inspect.getdoc(obj) or "").split("\n\n")[0].split("\n")
                kind = "autoclass" if inspect.isclass(obj) else "autofunction"
                entries += [f".. {kind}:: {name}"]
                if inspect.isclass(obj):
                    entries += ["   :members:", "   :inherited-members:"]
                entries.append("")
            else:  # a constant: its docstring is its type's, so use its comment
                doc = _comment_above(module, name)
                entries += [f".. py:data:: {name}", f"   :value: {obj!r}", ""]
                entries += [f"   {line}" for line in doc] + [""]
            summary = " ".join(d.strip() for d in doc if d.strip())
            table += [f"   * - :obj:`~{name}`", f"     - {summary}"]
        lines = table + [""] + entries
        node = nodes.Element()
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), 0, node)
        return node.children


def _skip_foreign_member(app, what, name, obj, skip, options):
    """Skip members a class inherits from outside prefopt (scikit-learn, torch).

    ``:inherited-members:`` brings in what a policy inherits from ``BasePolicy``
    (``fit``, ``sample``, ``predict``, ...); the methods of ``BaseEstimator`` and
    ``nn.Module`` (``get_params``, ``set_fit_request``, ``forward`` hooks) are
    documented by their own projects.
    """
    if what != "class":
        return None
    func = obj.fget if isinstance(obj, property) else obj
    func = inspect.unwrap(getattr(func, "__func__", func))
    module = getattr(func, "__module__", None)
    if callable(func) and module is not None and not module.startswith("prefopt"):
        return True
    return None


def _purge(app, env, docname):
    getattr(env, "prefopt_api_documented", {}).pop(docname, None)


def _merge(app, env, docnames, other):
    mine = env.prefopt_api_documented = getattr(env, "prefopt_api_documented", {})
    for docname in docnames:
        if docname in getattr(other, "prefopt_api_documented", {}):
            mine[docname] = other.prefopt_api_documented[docname]


def _check_complete(app, env):
    documented = set()
    for names in getattr(env, "prefopt_api_documented", {}).values():
        documented.update(id(_resolve(n)) for n in names)
    for modname in app.config.prefopt_api_modules:
        module = importlib.import_module(modname)
        for name in _public_names(module):
            if id(getattr(module, name)) not in documented:
                logger.warning(
                    "%s.%s is public (in %s.__all__) but not in the API reference; add it to "
                    "a group in docs/api.rst.",
                    modname,
                    name,
                    modname,
                    type="prefopt_api",
                )


def setup(app):
    app.add_config_value("prefopt_api_modules", [], "env")
    app.add_directive("prefopt-api", PrefoptAPI)
    app.connect("autodoc-skip-member", _skip_foreign_member)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check_complete)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
