"""The benchmarks, shipped in the package so that ``cupycoll bench NAME`` runs them after pip install."""
