"""Dataset specifications that name files: ``PREFIX:PATH`` with a PREFIX of `PATH_SOURCES`.

Kept apart from `leakbench.datasets` (whose import loads numpy, scikit-learn and every dataset
module) so that a config's paths are found and checked before anything heavy is imported.
"""

from __future__ import annotations

# The file sources whose PATH names a file or folder, image and text alike: a relative PATH in
# a config file is resolved against the config's folder (`leakbench.run.config.load_config`).
# A plugin's file source gets its PATH as the config wrote it (it may name something else).
PATH_SOURCES = ("npz", "idx", "folder", "text")


def source_path(spec: str) -> str | None:
    """The PATH of a dataset ``PREFIX:PATH`` whose PREFIX is one of `PATH_SOURCES`, else None."""
    prefix, sep, path = spec.partition(":")
    return path if sep and prefix in PATH_SOURCES else None
