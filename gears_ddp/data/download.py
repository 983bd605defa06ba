"""Download and unpack the published GEARS datasets and Gene Ontology files from Harvard Dataverse.

The published GEARS saves whatever the server returns, so an HTML error page can end up
saved as a ``.pkl`` and an interrupted download leaves a corrupt file that is "found" on the
next run. Here every download goes to a temporary file next to its destination, is checked
(HTTP status, content type, length, and that the content parses as the expected kind), and
only then moved into place with ``os.replace``; archives are extracted without letting any
member escape the data folder. Files already present locally are reused without any network
access.

Harvard Dataverse may refuse (it answers 403 Forbidden to scripted requests), so every
failure gives one message naming the missing files, the folder they belong in, and the
three ways to supply them: a mirror (``GEARS_DDP_DATAVERSE_URL``), a local archive
(``PertData.load(data_name=..., archive=...)``, ``go_archive=...`` for the GO files,
unpacked here as a download is), or the files placed in the folder by hand.
"""

import contextlib
import functools
import http.client
import logging
import os
import shutil
import stat
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
from tqdm import tqdm

from gears_ddp._logging import get_logger, log_once
from gears_ddp.data.io import atomic_path, loads_plain_data

logger = get_logger(__name__)

DATAVERSE_URL = "https://dataverse.harvard.edu/api/access/datafile/"
DATAVERSE_URL_ENV = "GEARS_DDP_DATAVERSE_URL"

DATASET_FILE_IDS = {
    "norman": 6154020,
    "adamson": 6154417,
    "dixit": 6154416,
    "replogle_k562_essential": 7458695,
    "replogle_rpe1_essential": 7458694,
}

GO_FILE_IDS = {
    "gene2go_all.pkl": 6153417,
    "essential_all_data_pert_genes.pkl": 6934320,
    "go_essential_all": 6934319,
}

DATASET_FILE = "perturb_processed.h5ad"
_GO_ARCHIVES = {"go_essential_all": "go_essential_all/go_essential_all.csv"}
_GO_PATHS = {name: _GO_ARCHIVES.get(name, name) for name in GO_FILE_IDS}  # where each GO input lies in a data folder
_ARCHIVE_SUFFIXES = {"zip": ".zip", "tar": ".tar.gz"}
_CHUNK_BYTES = 1 << 20
_HTML_PREFIXES = (b"<!doctype", b"<html")
_SYNTHETIC_HINT = (
    "For a no-download alternative, use the built-in synthetic dataset (gears_ddp.datasets.write_synthetic_dataset)."
)


class DownloadError(RuntimeError):
    """A download or extraction failed; nothing partial was left at the destination."""


def dataverse_url() -> str:
    """Base URL of the Dataverse file API, overridable by ``GEARS_DDP_DATAVERSE_URL`` (mirrors, tests)."""
    return os.environ.get(DATAVERSE_URL_ENV, DATAVERSE_URL).rstrip("/") + "/"


# --------------------------------------------------------------------------- downloading


def _open_url(url: str, dest: Path, timeout: float) -> http.client.HTTPResponse:
    """Open ``url``, turning HTTP errors and unreachable servers into ``DownloadError``."""
    request = urllib.request.Request(url, headers={"User-Agent": "gears_ddp"})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"HTTP status {exc.code} ({exc.reason}) from {url} while downloading {dest}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(f"could not reach {url} ({reason}) while downloading {dest}") from exc


def _check_response(response: http.client.HTTPResponse, url: str, dest: Path) -> None:
    """Reject non-200 statuses and HTML pages before any body is saved."""
    if response.status != 200:
        raise DownloadError(f"HTTP status {response.status} from {url} while downloading {dest}")
    if response.headers.get_content_type() == "text/html":
        raise DownloadError(f"{url} returned an HTML page (Content-Type text/html), not the data file for {dest}")


def _stream(response: http.client.HTTPResponse, tmp: Path, desc: str, total: int | None) -> int:
    """Copy the response body into ``tmp`` with a progress bar; return the number of bytes received."""
    received = 0
    with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=None) as bar:
        while chunk := response.read(_CHUNK_BYTES):
            out.write(chunk)
            received += len(chunk)
            bar.update(len(chunk))
    return received


def _fetch(url: str, tmp: Path, dest: Path, timeout: float) -> None:
    """Download ``url`` into ``tmp``, checking status, content type and Content-Length."""
    with _open_url(url, dest, timeout) as response:
        _check_response(response, url, dest)
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None  # a malformed header is ignored
        try:
            received = _stream(response, tmp, dest.name, expected)
        except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            raise DownloadError(f"download of {url} to {dest} was interrupted ({exc!r})") from exc
    if expected is not None and received != expected:
        raise DownloadError(f"truncated download from {url}: received {received} of {expected} bytes for {dest}")


def _check_not_html(path: Path, url: str, dest: Path) -> None:
    """Reject bodies that look like an HTML page even when the server did not say text/html."""
    with open(path, "rb") as f:
        head = f.read(512).lstrip().lower()
    if head.startswith(_HTML_PREFIXES):
        raise DownloadError(f"{url} returned an HTML page, not the data file for {dest}")


def _validate_pickle(path: Path) -> None:
    """The file must unpickle as plain data (the GO inputs are pickles that GEARS itself
    loads); one that asks to run code is refused."""
    loads_plain_data(path.read_bytes())


def _validate_zip(path: Path) -> None:
    """The file must be a zip archive whose members all pass their CRC check."""
    if not zipfile.is_zipfile(path):
        raise zipfile.BadZipFile("not a zip archive")
    with zipfile.ZipFile(path) as zf:
        bad = zf.testzip()
    if bad is not None:
        raise zipfile.BadZipFile(f"member {bad!r} is corrupt")


def _validate_tar(path: Path) -> None:
    """The file must be a (gzip-compressed) tar archive readable to its end."""
    with tarfile.open(path, "r:*") as tf:
        tf.getmembers()


def _validate_npy(path: Path) -> None:
    """The file must start with a numpy array header (its values are not read: an array of
    objects is a pickle, which only a reader that refuses code may open)."""
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(handle)


_VALIDATORS = {"pickle": _validate_pickle, "zip": _validate_zip, "tar": _validate_tar, "npy": _validate_npy}
KIND_OF_SUFFIX = {".zip": "zip", ".gz": "tar", ".tgz": "tar", ".tar": "tar", ".pkl": "pickle", ".npy": "npy"}


def download_file(url: str, dest, kind: str, timeout: float = 60) -> Path:
    """Download ``url`` to ``dest`` atomically, checking that the content is a valid ``kind`` file.

    ``kind`` is ``'pickle'``, ``'zip'``, ``'tar'`` or ``'npy'``. Raises ``DownloadError`` on a non-200
    status, an HTML page, a truncated body, an unreachable server or content that does not
    parse; in every failure case ``dest`` is left untouched and no temporary file remains.
    """
    if kind not in _VALIDATORS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(_VALIDATORS)}")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    logger.info("downloading %s to %s", url, dest)
    with atomic_path(dest) as tmp:
        _fetch(url, tmp, dest, timeout)
        _check_not_html(tmp, url, dest)
        try:
            _VALIDATORS[kind](tmp)
        except Exception as exc:  # a parser may raise almost anything on garbage input
            raise DownloadError(f"content from {url} is not a valid {kind} file for {dest} ({exc!r})") from exc
    logger.info("saved %s", dest)
    return dest


# --------------------------------------------------------------------------- extraction


@contextlib.contextmanager
def _archive_entries(archive: Path, kind: str):
    """Open a zip or tar archive and yield its members as ``(name, is_dir, open_member)`` triples.

    Tar links and device files are refused: only regular files and folders are extracted.
    """
    if kind == "zip":
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if stat.S_ISLNK(info.external_attr >> 16):
                    raise DownloadError(f"refusing to extract {archive}: member {info.filename!r} is a link")
            yield [(i.filename, i.is_dir(), functools.partial(zf.open, i)) for i in zf.infolist()]
        return
    with tarfile.open(archive, "r:*") as tf:
        members = tf.getmembers()
        for m in members:
            if not (m.isfile() or m.isdir()):
                raise DownloadError(f"refusing to extract {archive}: member {m.name!r} is a link or special file")
        yield [(m.name, m.isdir(), functools.partial(tf.extractfile, m)) for m in members]


def _safe_target(root: Path, name: str, archive: Path) -> Path:
    """Map an archive member name to a path inside ``root``, refusing any that escapes it (zip-slip)."""
    posix = name.replace("\\", "/")
    target = os.path.normpath(os.path.join(root, posix))
    escapes = os.path.commonpath([root, target]) != str(root)
    if PurePosixPath(posix).is_absolute() or PureWindowsPath(name).drive or escapes:
        raise DownloadError(f"refusing to extract {archive}: member {name!r} would escape {root}")
    return Path(target)


def _extract_archive(archive: Path, root: Path, kind: str) -> None:
    """Extract every member of ``archive`` under ``root``; all names are checked before anything is written.

    Each file is written through ``atomic_path`` so an interrupted extraction never leaves a
    truncated file that a later run would take for a valid local copy.
    """
    root = Path(os.path.abspath(root))
    with _archive_entries(archive, kind) as entries:
        checked = [(_safe_target(root, name, archive), is_dir, opener) for name, is_dir, opener in entries]
        for target, is_dir, open_member in checked:
            if is_dir:
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with open_member() as src, atomic_path(target) as tmp, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)


# --------------------------------------------------------------------------- local archives


def archive_kind(archive: Path) -> str:
    """``'zip'`` or ``'tar'`` (plain or compressed) by the archive's content, whatever its name."""
    if zipfile.is_zipfile(archive):
        return "zip"
    if tarfile.is_tarfile(archive):
        return "tar"
    raise ValueError(f"{archive} is neither a zip nor a tar archive (.zip, .tar.gz)")


def _local_archive(archive) -> tuple[Path, str]:
    """An archive the user gave: its path and kind, checked whole before anything is extracted."""
    archive = Path(archive)
    if not archive.is_file():
        raise FileNotFoundError(f"archive {archive} does not exist" + (" (it is a folder)" if archive.is_dir() else ""))
    kind = archive_kind(archive)
    try:
        _VALIDATORS[kind](archive)
    except Exception as exc:  # a parser may raise almost anything on a damaged archive
        raise ValueError(f"archive {archive} is damaged ({exc!r})") from None
    return archive, kind


def _member_names(archive: Path, kind: str) -> list[str]:
    with _archive_entries(archive, kind) as entries:
        return [name.replace("\\", "/").strip("/") for name, _, _ in entries]


def unpack_dataset_archive(archive, name: str, data_path) -> Path:
    """Extract a local archive of a dataset folder (zip or tar.gz, as the published files are)
    so that ``data_path/name/perturb_processed.h5ad`` exists; the archive may hold the folder
    ``name/`` or the folder's files. Returns the dataset folder."""
    archive, kind = _local_archive(archive)
    names = _member_names(archive, kind)
    if f"{name}/{DATASET_FILE}" in names:
        root = Path(data_path)
    elif DATASET_FILE in names:
        root = Path(data_path) / name
    else:
        raise ValueError(
            f"archive {archive} holds neither {name}/{DATASET_FILE} nor {DATASET_FILE} (it holds "
            f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''})"
        )
    _extract_archive(archive, root, kind)
    logger.info("extracted %s from %s", Path(data_path) / name / DATASET_FILE, archive)
    return Path(data_path) / name


def unpack_go_archive(archive, data_path) -> None:
    """Extract a local archive holding Gene Ontology files at their published paths
    (``gene2go_all.pkl``, ``essential_all_data_pert_genes.pkl``,
    ``go_essential_all/go_essential_all.csv``; the published ``go_essential_all`` tar.gz is
    one) into ``data_path``."""
    archive, kind = _local_archive(archive)
    known = set(_GO_PATHS.values())
    if not known & set(_member_names(archive, kind)):
        raise ValueError(f"archive {archive} holds none of the GO files {', '.join(sorted(known))}")
    _extract_archive(archive, Path(data_path), kind)
    logger.info("extracted GO files from %s into %s", archive, data_path)


# --------------------------------------------------------------------------- ensure_* entry points


def _found(path: Path) -> bool:
    """True (and logged, once a process: ``log_once``) when a local copy exists, so no
    network access is needed."""
    if path.is_file():
        log_once(logger, logging.INFO, "found local copy %s", path)
        return True
    return False


def _lookup(table: dict, name: str, what: str, extra: str = "") -> str:
    """File id of ``name`` in ``table``; ``ValueError`` listing the known names otherwise."""
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known {what}s: {', '.join(sorted(table))}{extra}")
    return str(table[name])


def _download(url: str, kind: str, expected: Path) -> None:
    """Download ``url`` to provide ``expected``: the file itself, or an archive (saved beside
    the folder it unpacks to, then removed) whose extraction must produce it."""
    if kind not in _ARCHIVE_SUFFIXES:
        download_file(url, expected, kind)
        return
    archive = expected.parent.parent / f"{expected.parent.name}{_ARCHIVE_SUFFIXES[kind]}"
    download_file(url, archive, kind)
    try:
        _extract_archive(archive, archive.parent, kind)
    finally:
        archive.unlink(missing_ok=True)
    if not expected.is_file():
        raise DownloadError(f"{archive.name} from {url} was extracted but {expected} is missing")
    logger.info("extracted %s", expected)


def _mirror_advice(file_ids) -> str:
    return (
        f"a mirror of the published files: set {DATAVERSE_URL_ENV} to its file API (it serves each file by "
        f"its Dataverse id: {', '.join(str(i) for i in file_ids)})"
    )


def ensure_dataset(name: str, data_path, archive=None) -> Path:
    """Return ``data_path/name`` holding ``perturb_processed.h5ad``: the local copy if there
    is one, else extracted from ``archive`` (a local zip or tar.gz of the dataset folder),
    else downloaded. Only a missing file of a name outside ``DATASET_FILE_IDS`` without an
    archive is a ``ValueError``; a refused download is one ``DownloadError`` saying how to
    supply the file."""
    folder = Path(data_path) / name
    expected = folder / DATASET_FILE
    if _found(expected):
        return folder
    if archive is not None:
        return unpack_dataset_archive(archive, name, data_path)
    file_id = _lookup(DATASET_FILE_IDS, name, "dataset", f" (or place {DATASET_FILE} in {folder})")
    try:
        _download(dataverse_url() + file_id, "zip", expected)
    except DownloadError as exc:
        raise DownloadError(
            f"{exc}. Missing: {expected}. Supply it in one of three ways: {_mirror_advice([file_id])}; a local "
            f"archive of the published folder (zip or tar.gz): PertData({str(data_path)!r}).load(data_name={name!r}, "
            f"archive='{name}.zip'); or the folder itself: put {DATASET_FILE} in {folder}/ (any folder holding it "
            f"loads with PertData.load(data_path=...)). {_SYNTHETIC_HINT}"
        ) from exc
    return folder


def ensure_go_files(names, data_path, archive=None) -> list[Path]:
    """The local paths of the Gene Ontology inputs ``names`` (keys of ``GO_FILE_IDS``; for
    ``'go_essential_all'``, a tar.gz archive, the extracted csv): local copies if there are,
    else extracted from ``archive`` (a local zip or tar.gz holding them at their published
    paths), else downloaded. When some cannot be had, one ``DownloadError`` names every
    missing file and how to supply them, before any work depends on them."""
    data_path = Path(data_path)
    for name in names:
        _lookup(GO_FILE_IDS, name, "GO file")
    expected = {name: data_path / _GO_PATHS[name] for name in names}
    if archive is not None and not all(path.is_file() for path in expected.values()):
        unpack_go_archive(archive, data_path)
    failures = {}
    for name, path in expected.items():
        if _found(path):
            continue
        try:
            _download(dataverse_url() + str(GO_FILE_IDS[name]), "tar" if name in _GO_ARCHIVES else "pickle", path)
        except DownloadError as exc:
            failures[name] = exc
    if failures:
        missing = [str(expected[name]) for name in failures]
        reasons = "; ".join(str(exc) for exc in failures.values())
        raise DownloadError(
            f"{len(failures)} Gene Ontology input file(s) are missing and could not be downloaded ({reasons}). "
            f"Missing: {', '.join(missing)}. Supply them in one of three ways: "
            f"{_mirror_advice(GO_FILE_IDS[name] for name in failures)}; a local archive holding them at these paths "
            f"under {data_path} (zip or tar.gz; the published go_essential_all.tar.gz holds the graph): "
            f"PertData({str(data_path)!r}).load(..., go_archive='go_files.zip'); or the folder itself: put them in "
            f"{data_path}, or build them from a gene-to-GO annotation of your own (gears-ddp process --go-annotation "
            f"FILE.gaf or --go-gene-sets FILE.gmt). {_SYNTHETIC_HINT}"
        )
    return list(expected.values())


def local_go_file(name: str, data_path) -> Path | None:
    """The local copy of the Gene Ontology input ``name`` (a key of ``GO_FILE_IDS``) in
    ``data_path``, or None when there is none: nothing is downloaded."""
    _lookup(GO_FILE_IDS, name, "GO file")
    path = Path(data_path) / _GO_PATHS[name]
    return path if path.is_file() else None


def ensure_go_file(name: str, data_path) -> Path:
    """``ensure_go_files`` for one file."""
    return ensure_go_files([name], data_path)[0]
