"""The published package's ``gears.utils`` helper that its tutorials import:
``dataverse_download(url, save_path)`` (``from gears.utils import dataverse_download``
becomes ``from gears_ddp.utils import dataverse_download``)."""

from __future__ import annotations

from pathlib import Path

from gears_ddp._logging import get_logger
from gears_ddp.data.download import KIND_OF_SUFFIX, download_file

logger = get_logger(__name__)


def dataverse_download(url: str, save_path) -> Path:
    """Download ``url`` (a Harvard Dataverse file) to ``save_path`` unless a file is already
    there, as published; here written atomically and checked to be what its name says (a
    .zip, .tar.gz, .pkl or .npy file: ``data.download.download_file``), so that an error page
    or a cut download never lies where a data file should. Returns the path."""
    path = Path(save_path)
    if path.exists():
        logger.info("found local copy of %s at %s", url, path)
        return path
    kind = KIND_OF_SUFFIX.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"dataverse_download checks what it downloads by the file's name: name {path} *.zip, "
            f"*.tar.gz, *.pkl or *.npy"
        )
    return download_file(url, path, kind)
