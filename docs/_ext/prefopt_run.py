"""The ``prefopt-run`` directive: a code block that the docs build executes.

``.. prefopt-run::`` followed by indented Python renders the code, runs it while the
page is read, and renders what it printed below it; when the block ends with an
expression, its ``repr`` is printed too, as in a notebook. The blocks of one page
share one namespace, in order, so a page reads as one script. Any exception fails
the build (a :class:`sphinx.errors.ExtensionError` naming the page, the line and the
traceback), with or without ``-W``: the user guide's code cannot go stale.

Each page runs in a temporary working folder of its own (removed when the build
ends), with prefopt's progress bars off; the prefopt configuration a block sets
with ``set_config`` holds for the rest of its page only. A warning is shown in the
output when the page's own code is where it points (``stacklevel`` at the caller,
as prefopt's warnings are); warnings from inside libraries are left out.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import shutil
import tempfile
import traceback
import warnings

from docutils import nodes
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective

_FOLDERS: list[str] = []  # the pages' working folders, removed at build-finished


def _page_state(env) -> dict:
    """The current page's namespace, prefopt configuration and working folder."""
    state = env.temp_data.get("prefopt_run")
    if state is None:
        import prefopt

        folder = tempfile.mkdtemp(prefix="prefopt-docs-")
        _FOLDERS.append(folder)
        config = {**prefopt.get_config(), "show_progress_bar": False}
        state = env.temp_data["prefopt_run"] = {
            "namespace": {"__name__": "__main__"},
            "config": config,
            "folder": folder,
        }
    return state


def _execute(source: str, filename: str, namespace: dict) -> str:
    """Run ``source`` in ``namespace``; return what it printed (and its last value)."""
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                print(repr(value))
    shown = [f"{w.category.__name__}: {w.message}" for w in caught if w.filename == filename]
    return out.getvalue() + "".join(f"{line}\n" for line in shown)


class PrefoptRun(SphinxDirective):
    has_content = True
    required_arguments = 0
    optional_arguments = 0

    def run(self) -> list[nodes.Node]:
        import prefopt

        source = "\n".join(self.content)
        state = _page_state(self.env)
        self.env.note_reread()  # run again at every build, not only when the page changes
        where = f"{self.env.docname}.rst, line {self.lineno}"
        filename = f"<{self.env.docname}.rst:{self.lineno}>"
        saved, cwd = prefopt.get_config(), os.getcwd()
        prefopt.set_config(**state["config"])
        os.chdir(state["folder"])
        try:
            output = _execute(source, filename, state["namespace"])
        except Exception as error:  # any failure of the page's code fails the build
            trace = "".join(traceback.format_exception(error))
            raise ExtensionError(f"prefopt-run: the code at {where} failed:\n{trace}") from None
        finally:
            os.chdir(cwd)
            state["config"] = prefopt.get_config()
            prefopt.set_config(**saved)
        code = nodes.literal_block(source, source, language="python")
        self.set_source_info(code)
        result = [code]
        if output.strip():
            shown = output.rstrip("\n")
            block = nodes.literal_block(shown, shown, language="none")
            block["classes"].append("prefopt-run-output")
            result.append(block)
        return result


def _remove_folders(app, exception) -> None:
    while _FOLDERS:
        shutil.rmtree(_FOLDERS.pop(), ignore_errors=True)


def setup(app):
    app.add_directive("prefopt-run", PrefoptRun)
    app.connect("build-finished", _remove_folders)
    # The namespaces live in each reading process: pages cannot be read in parallel.
    return {"parallel_read_safe": False, "parallel_write_safe": True}
