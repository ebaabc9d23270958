"""The main demo: the preference world of the plate (see preference_world.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from preference_world import main  # noqa: E402

if __name__ == "__main__":
    main()
