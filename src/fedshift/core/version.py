"""fedshift's version (the package's ``fedshift.__version__``; pyproject.toml says the same)."""

VERSION = "0.1.0"
