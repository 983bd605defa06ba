"""Download and unpack the published GEARS datasets and Gene Ontology files from Harvard Dataverse.

The published GEARS saves whatever the server returns, so an HTML error page can end up
saved as a ``.pkl`` and an interrupted download leaves a corrupt file that is "found" on the
next run. Here every download goes to a temporary file next to its destination, is checked
(HTTP status, content type, length, and that the content parses as the expected kind), and
only then moved into place with ``os.replace``; archives are extracted without letting any
member escape the data folder. Files already present locally are reused without any network
access, and a failed download says which local files are missing and how to supply them.
"""
import contextlib
import functools
import http.client
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from tqdm import tqdm

from gears_ddp._logging import get_logger
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
_ARCHIVE_SUFFIXES = {"zip": ".zip", "tar": ".tar.gz"}
_CHUNK_BYTES = 1 << 20
_HTML_PREFIXES = (b"<!doctype", b"<html")
_SYNTHETIC_HINT = (
    "For a no-download alternative, use the built-in synthetic dataset "
    "(gears_ddp.datasets.write_synthetic_dataset)."
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
        raise DownloadError(
            f"{url} returned an HTML page (Content-Type text/html), not the data file for {dest}"
        )


def _stream(response: http.client.HTTPResponse, tmp: Path, desc: str, total: int | None) -> int:
    """Copy the response body into ``tmp`` with a progress bar; return the number of bytes received."""
    received = 0
    with open(tmp, "wb") as out, tqdm(
        total=total, unit="B", unit_scale=True, desc=desc, disable=None
    ) as bar:
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
        raise DownloadError(
            f"truncated download from {url}: received {received} of {expected} bytes for {dest}"
        )


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


_VALIDATORS = {"pickle": _validate_pickle, "zip": _validate_zip, "tar": _validate_tar}


def download_file(url: str, dest, kind: str, timeout: float = 60) -> Path:
    """Download ``url`` to ``dest`` atomically, checking that the content is a valid ``kind`` file.

    ``kind`` is ``'pickle'``, ``'zip'`` or ``'tar'``. Raises ``DownloadError`` on a non-200
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


# --------------------------------------------------------------------------- ensure_* entry points


@dataclass(frozen=True)
class _Remote:
    """One downloadable item: its URL, what it must produce locally, and how a user can supply it instead."""

    url: str
    kind: str
    expected: Path
    hint: str

    @property
    def download_to(self) -> Path:
        """Where the downloaded file is saved: the expected file itself, or an archive in the data folder."""
        if self.kind not in _ARCHIVE_SUFFIXES:
            return self.expected
        top = self.expected.parent.name
        return self.expected.parent.parent / f"{top}{_ARCHIVE_SUFFIXES[self.kind]}"


def _found(path: Path) -> bool:
    """True (and logged) when a local copy exists, so no network access is needed."""
    if path.is_file():
        logger.info("found local copy %s", path)
        return True
    return False


def _lookup(table: dict, name: str, what: str, extra: str = "") -> str:
    """File id of ``name`` in ``table``; ``ValueError`` listing the known names otherwise."""
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known {what}s: {', '.join(sorted(table))}{extra}")
    return str(table[name])


def _download_and_unpack(item: _Remote) -> None:
    """Download ``item`` (extracting it if it is an archive) and check that its expected file now exists."""
    archive = item.download_to
    download_file(item.url, archive, item.kind)
    if archive == item.expected:
        return
    try:
        _extract_archive(archive, archive.parent, item.kind)
    finally:
        archive.unlink(missing_ok=True)
    if not item.expected.is_file():
        raise DownloadError(f"{archive.name} from {item.url} was extracted but {item.expected} is missing")
    logger.info("extracted %s", item.expected)


def _fetch_missing(item: _Remote) -> None:
    """Provide ``item.expected`` by downloading it, explaining how to supply it locally if that fails."""
    try:
        _download_and_unpack(item)
    except DownloadError as exc:
        raise DownloadError(
            f"{exc}\nMissing local file: {item.expected}. To work without downloading, {item.hint}. "
            f"{_SYNTHETIC_HINT}"
        ) from exc


def ensure_dataset(name: str, data_path) -> Path:
    """Return ``data_path/name`` holding ``perturb_processed.h5ad``, downloading it only if absent.

    A local copy is always used first, so any dataset folder prepared by hand works; only a
    missing file of a name outside ``DATASET_FILE_IDS`` is a ``ValueError``.
    """
    folder = Path(data_path) / name
    expected = folder / DATASET_FILE
    if _found(expected):
        return folder
    file_id = _lookup(DATASET_FILE_IDS, name, "dataset", f" (or place {DATASET_FILE} in {folder})")
    hint = f"copy {DATASET_FILE} into {folder}/ and call PertData.load(data_path=...)"
    _fetch_missing(_Remote(dataverse_url() + file_id, "zip", expected, hint))
    return folder


def ensure_go_files(names, data_path) -> list[Path]:
    """``ensure_go_file`` for each of ``names``; when some cannot be had, one error names every
    missing file (not the first only), before any work depends on them."""
    paths, missing = [], []
    for name in names:
        try:
            paths.append(ensure_go_file(name, data_path))
        except DownloadError as err:
            missing.append(f"{Path(data_path) / _GO_ARCHIVES.get(name, name)} ({str(err).splitlines()[0]})")
    if missing:
        raise DownloadError(f"{len(missing)} Gene Ontology input file(s) are missing and could not be downloaded:\n  "
                            + "\n  ".join(missing) + f"\nPlace them in {data_path} (the published GEARS files), "
                            f"or build them from your own gene-to-GO annotation. {_SYNTHETIC_HINT}")
    return paths


def ensure_go_file(name: str, data_path) -> Path:
    """Return the local path of Gene Ontology input ``name`` (a key of ``GO_FILE_IDS``), downloading it only if absent.

    For ``'go_essential_all'`` (a tar.gz archive) the returned path is the extracted csv.
    """
    file_id = _lookup(GO_FILE_IDS, name, "GO file")
    data_path = Path(data_path)
    relative = _GO_ARCHIVES.get(name, name)
    expected = data_path / relative
    if _found(expected):
        return expected
    kind = "tar" if name in _GO_ARCHIVES else "pickle"
    hint = f"place {relative} in {data_path}"
    _fetch_missing(_Remote(dataverse_url() + file_id, kind, expected, hint))
    return expected
