"""Exact testbeds: worlds whose closed-form optimum is known."""

from .preference import PreferenceWorld

__all__ = ["PreferenceWorld"]
