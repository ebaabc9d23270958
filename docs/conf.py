"""Sphinx configuration: the API reference, built from the docstrings with numpydoc.

Build with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# Document this checkout, not whichever prefopt the environment has installed.
sys.path.insert(0, str(DOCS.parent))
sys.path.insert(0, str(DOCS / "_ext"))


import prefopt  # noqa: E402

project = "prefopt"
author = "the prefopt authors"
copyright = "the prefopt authors"
release = prefopt.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
    "prefopt_api",
    "prefopt_run",  # executes the user guide's code blocks: a failing block fails the build
]

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = f"prefopt {release}"
html_static_path = ["_static"]
html_css_files = ["prefopt.css"]

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # the numpydoc Parameters sections give the types

numpydoc_show_class_members = False  # autodoc's :members: lists them once
numpydoc_class_members_toctree = False
numpydoc_validation_checks = {
    "GL08",  # a public object without a docstring
    *("PR01", "PR02", "PR03", "PR05", "PR06", "PR08", "PR09", "PR10"),  # Parameters
    "RT04",
    "RT05",
}

# Every name exported by these modules must appear in docs/api.rst.
prefopt_api_modules = [
    "prefopt",
    "prefopt.kl",
    "prefopt.data",
    "prefopt.rewards",
    "prefopt.policies",
    "prefopt.lm",
    "prefopt.worlds",
    "prefopt.environments",
    "prefopt.model_selection",
    "prefopt.metrics",
    "prefopt.plotting",
    "prefopt.backend",
    "prefopt.validation",
]
