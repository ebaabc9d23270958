"""Reproductions of the papers' claims: one script per claim, built on prefopt's public API."""
