"""Calibrated time models: machine profiles, predicted call times, ``tune`` and ``simulate``.

``profile`` (what a message, a byte, an element of local work cost), ``predict`` (one call's
time from the algorithms' exact traffic models), ``calibrate`` (``python -m cupycoll tune``),
``simulate`` (``python -m cupycoll simulate``: sparse and top-k families to 1,024 ranks).
"""

from .profile import Profile, default_profile, load_profile, profile_for, save_profile

__all__ = ["Profile", "default_profile", "load_profile", "profile_for", "save_profile"]
