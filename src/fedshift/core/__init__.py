"""The foundation every layer may use: user-facing errors (:mod:`~fedshift.core.errors`), the
registry helper for named things (:mod:`~fedshift.core.registry`), your own plugin files
(:mod:`~fedshift.core.plugins`), derived random streams (:mod:`~fedshift.core.seeds`) and
atomic file writes (:mod:`~fedshift.core.files`). It imports nothing else of fedshift."""
