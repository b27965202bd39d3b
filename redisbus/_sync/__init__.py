# Generated from redisbus/_async/__init__.py by scripts/unasync.py: do not edit.
"""The async face, written once: ``Bus`` -> ``Channel`` -> ``Agent``.

This package is the source of both faces: ``scripts/unasync.py`` generates ``redisbus/_sync``
(``Bus`` -> ``Channel`` -> ``Agent``) from it. Edit here, then run ``make unasync``."""
