"""The async face, written once: ``AsyncBus`` -> ``AsyncChannel`` -> ``AsyncAgent``.

This package is the source of both faces: ``scripts/unasync.py`` generates ``redisbus/_sync``
(``Bus`` -> ``Channel`` -> ``Agent``) from it. Edit here, then run ``make unasync``."""
