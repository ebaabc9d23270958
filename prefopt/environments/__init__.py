"""Adapters that make other libraries' environments prefopt environments (``environment=``)."""

from ._openenv import OpenEnvEnvironment

__all__ = ["OpenEnvEnvironment"]
